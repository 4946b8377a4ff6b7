package redis

// ClaimScriptHashes are the SHA1s of the scripts that make a claim (each
// form of claimScript), for tests that must recognise a
// claim on the wire.
func ClaimScriptHashes() []string {
	var h []string
	for _, ks := range []*keyScript{claimScript} {
		h = append(h, ks.one.Hash(), ks.many.Hash())
	}
	return h
}
