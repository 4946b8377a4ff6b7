package sfv

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// ErrSyntax reports a field value that is not a valid Item. A field that
// fails to parse is treated as absent or invalid by its caller, never
// repaired.
var ErrSyntax = errors.New("sfv: invalid structured field value")

// Kind is the type of a bare item.
type Kind uint8

// Kinds of bare item (RFC 8941 section 3.3).
const (
	Integer Kind = iota + 1
	Decimal
	String
	Token
	ByteSequence
	Boolean
)

// BareItem is a value: the field that its Kind names holds it.
type BareItem struct {
	Kind  Kind
	Int   int64   // Integer
	Dec   float64 // Decimal
	Str   string  // String (unescaped) or Token
	Bytes []byte  // ByteSequence
	Bool  bool    // Boolean
}

// Param is one parameter of an Item.
type Param struct {
	Key   string
	Value BareItem
}

// Item is a bare item and its parameters, in the order their keys first
// appeared (a repeated key keeps its last value, RFC 8941 section 4.2.3.2).
type Item struct {
	BareItem
	Params []Param
}

// ParseItem parses a field value as an Item (RFC 8941 section 4.2: leading
// and trailing spaces are discarded; anything else left over fails). A
// field sent in several lines must be joined with ", " first, which makes
// an Item fail: an Item field is one value.
func ParseItem(field string) (Item, error) {
	p := parser{s: strings.TrimLeft(field, " ")}
	it, err := p.item()
	if err != nil {
		return Item{}, err
	}
	if strings.TrimLeft(p.s, " ") != "" {
		return Item{}, p.fail("characters after the item")
	}
	return it, nil
}

type parser struct{ s string }

func (p *parser) fail(what string) error {
	return errors.Join(ErrSyntax, errors.New("sfv: "+what))
}

func (p *parser) item() (Item, error) {
	b, err := p.bareItem()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	return Item{BareItem: b, Params: params}, err
}

func (p *parser) bareItem() (BareItem, error) {
	if p.s == "" {
		return BareItem{}, p.fail("empty item")
	}
	switch c := p.s[0]; {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	}
	return BareItem{}, p.fail("unknown item type")
}

// params parses parameters (section 4.2.3.2).
func (p *parser) params() ([]Param, error) {
	var out []Param
	for p.s != "" && p.s[0] == ';' {
		p.s = strings.TrimLeft(p.s[1:], " ")
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		v := BareItem{Kind: Boolean, Bool: true}
		if p.s != "" && p.s[0] == '=' {
			p.s = p.s[1:]
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		i := 0
		for i < len(out) && out[i].Key != key {
			i++
		}
		if i < len(out) {
			out[i].Value = v
		} else {
			out = append(out, Param{Key: key, Value: v})
		}
	}
	return out, nil
}

// key parses a parameter key (section 4.2.3.3).
func (p *parser) key() (string, error) {
	if p.s == "" || !(p.s[0] == '*' || isLower(p.s[0])) {
		return "", p.fail("parameter key must start with a lowercase letter or *")
	}
	n := 1
	for n < len(p.s) && (isLower(p.s[n]) || isDigit(p.s[n]) || strings.IndexByte("_-.*", p.s[n]) >= 0) {
		n++
	}
	k := p.s[:n]
	p.s = p.s[n:]
	return k, nil
}

// number parses an Integer or Decimal (section 4.2.4).
func (p *parser) number() (BareItem, error) {
	n, neg := 0, false
	if p.s[0] == '-' {
		neg, n = true, 1
	}
	start, dot := n, -1
	for ; n < len(p.s); n++ {
		c := p.s[n]
		if isDigit(c) {
			continue
		}
		if c == '.' && dot < 0 {
			if n-start > 12 {
				return BareItem{}, p.fail("decimal with more than 12 integer digits")
			}
			dot = n
			continue
		}
		break
	}
	text := p.s[start:n]
	switch {
	case text == "" || !isDigit(text[0]):
		return BareItem{}, p.fail("number without digits")
	case dot < 0 && len(text) > 15:
		return BareItem{}, p.fail("integer of more than 15 digits")
	case dot >= 0 && (n-dot-1 == 0 || n-dot-1 > 3):
		return BareItem{}, p.fail("decimal needs 1 to 3 fractional digits")
	}
	p.s = p.s[n:]
	if dot < 0 {
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return BareItem{}, p.fail("integer out of range")
		}
		if neg {
			v = -v
		}
		return BareItem{Kind: Integer, Int: v}, nil
	}
	v, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return BareItem{}, p.fail("decimal out of range")
	}
	if neg {
		v = -v
	}
	return BareItem{Kind: Decimal, Dec: v}, nil
}

// str parses a String (section 4.2.5): printable ASCII, with \" and \\ the
// only escapes.
func (p *parser) str() (BareItem, error) {
	var b strings.Builder
	for n := 1; n < len(p.s); n++ {
		switch c := p.s[n]; {
		case c == '\\':
			if n+1 == len(p.s) || p.s[n+1] != '"' && p.s[n+1] != '\\' {
				return BareItem{}, p.fail("string with an escape other than \\\" or \\\\")
			}
			n++
			b.WriteByte(p.s[n])
		case c == '"':
			p.s = p.s[n+1:]
			return BareItem{Kind: String, Str: b.String()}, nil
		case c < 0x20 || c > 0x7e:
			return BareItem{}, p.fail("string with a character outside printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return BareItem{}, p.fail("string without its closing quote")
}

// token parses a Token (section 4.2.6); its first character was checked.
func (p *parser) token() BareItem {
	n := 1
	for n < len(p.s) && (isTchar(p.s[n]) || p.s[n] == ':' || p.s[n] == '/') {
		n++
	}
	t := p.s[:n]
	p.s = p.s[n:]
	return BareItem{Kind: Token, Str: t}
}

// bytes parses a Byte Sequence (section 4.2.7); missing "=" padding is
// accepted, as the RFC asks.
func (p *parser) bytes() (BareItem, error) {
	end := strings.IndexByte(p.s[1:], ':')
	if end < 0 {
		return BareItem{}, p.fail("byte sequence without its closing colon")
	}
	enc := p.s[1 : 1+end]
	for i := 0; i < len(enc); i++ {
		if c := enc[i]; !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return BareItem{}, p.fail("byte sequence with a character outside base64")
		}
	}
	b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(enc, "="))
	if err != nil {
		return BareItem{}, p.fail("byte sequence that is not base64")
	}
	p.s = p.s[2+end:]
	return BareItem{Kind: ByteSequence, Bytes: b}, nil
}

// boolean parses a Boolean (section 4.2.8).
func (p *parser) boolean() (BareItem, error) {
	if len(p.s) < 2 || p.s[1] != '0' && p.s[1] != '1' {
		return BareItem{}, p.fail("boolean other than ?0 or ?1")
	}
	v := p.s[1] == '1'
	p.s = p.s[2:]
	return BareItem{Kind: Boolean, Bool: v}, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool { return isLower(c) || c >= 'A' && c <= 'Z' }

// isTchar reports an RFC 9110 token character.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
