package sfv

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestParseItem: the RFC 8941 examples and edge cases of each type, and
// the Idempotency-Key forms a server meets.
func TestParseItem(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want BareItem
		n    int // parameters
	}{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, BareItem{Kind: String, Str: "8e03978e-40d5-43e8-bc93-6894a57f9324"}, 0},
		{`  "a b"  `, BareItem{Kind: String, Str: "a b"}, 0},
		{`"say \"hi\" \\ bye"`, BareItem{Kind: String, Str: `say "hi" \ bye`}, 0},
		{`""`, BareItem{Kind: String, Str: ""}, 0},
		{`"k";a=1;b;c="x";a=2`, BareItem{Kind: String, Str: "k"}, 3},
		{`"k"; *x-1.y_z=?0`, BareItem{Kind: String, Str: "k"}, 1},
		{`42`, BareItem{Kind: Integer, Int: 42}, 0},
		{`-999999999999999`, BareItem{Kind: Integer, Int: -999999999999999}, 0},
		{`4.5`, BareItem{Kind: Decimal, Dec: 4.5}, 0},
		{`-123456789012.123`, BareItem{Kind: Decimal, Dec: -123456789012.123}, 0},
		{`foo123/456`, BareItem{Kind: Token, Str: "foo123/456"}, 0},
		{`*tok:en`, BareItem{Kind: Token, Str: "*tok:en"}, 0},
		{`:cHJldGVuZCB0aGlzIGlzIGJpbmFyeSBjb250ZW50Lg==:`, BareItem{Kind: ByteSequence, Bytes: []byte("pretend this is binary content.")}, 0},
		{`:cHJldGVuZCB0aGlzIGlzIGJpbmFyeSBjb250ZW50Lg:`, BareItem{Kind: ByteSequence, Bytes: []byte("pretend this is binary content.")}, 0},
		{`?1`, BareItem{Kind: Boolean, Bool: true}, 0},
		{`?0`, BareItem{Kind: Boolean, Bool: false}, 0},
	} {
		it, err := ParseItem(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if it.Kind != tc.want.Kind || it.Int != tc.want.Int || it.Dec != tc.want.Dec || it.Str != tc.want.Str ||
			!bytes.Equal(it.Bytes, tc.want.Bytes) || it.Bool != tc.want.Bool || len(it.Params) != tc.n {
			t.Errorf("%s: %+v, want %+v with %d parameters", tc.in, it, tc.want, tc.n)
		}
	}
	// A repeated parameter keeps its first place and its last value.
	it, _ := ParseItem(`"k";a=1;b;a=2`)
	if it.Params[0].Key != "a" || it.Params[0].Value.Int != 2 || it.Params[1].Key != "b" || !it.Params[1].Value.Bool {
		t.Errorf("parameters %+v", it.Params)
	}
}

// TestParseItemRefuses: values that are not one valid Item fail with
// ErrSyntax, among them two header lines joined and an unquoted key.
func TestParseItemRefuses(t *testing.T) {
	for _, in := range []string{
		``, `   `, `"unterminated`, `"bad \n escape"`, "\"tab\there\"", "\"caf\xc3\xa9\"", `"a", "b"`, `"a" "b"`, `"a";`,
		`"a";A=1`, `"a";1=1`, `"a";a=`, `"a"\t`, "\t\"a\"",
		`1234567890123456`, `1234567890123.1`, `1.1234`, `1.`, `-`, `-a`, `--1`, `1.2.3`,
		`:abc`, `:ab$c:`, `:a=b:`, `?2`, `?`, `@x`, `(1 2)`, `a=1`, `a, b`,
	} {
		if it, err := ParseItem(in); !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: %+v, %v, want ErrSyntax", in, it, err)
		}
	}
}

// FuzzParseItem: no input panics; a String item holds printable ASCII
// only; a parsed String, written back with its escapes, parses to itself.
func FuzzParseItem(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b";x=1`, `12.5`, `tok`, `:YQ==:`, `?1`, `"k";a;b=?0`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		it, err := ParseItem(in)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("%q: %v is not ErrSyntax", in, err)
			}
			return
		}
		if it.Kind != String {
			return
		}
		for i := 0; i < len(it.Str); i++ {
			if c := it.Str[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("%q gave a string holding %#x", in, c)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(it.Str) + `"`
		again, err := ParseItem(quoted)
		if err != nil || again.Str != it.Str {
			t.Fatalf("%q: %q parsed as %q, %v", in, quoted, again.Str, err)
		}
	})
}
