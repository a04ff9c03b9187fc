package attest

import "testing"

func policyTestPassport(t testing.TB) *Passport {
	t.Helper()
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"all","token":{"env":"T_ALL"},"scopes":["app:write"],"claims":{"pinboard":{"namespaces":["*"]}}},
		{"name":"counters","token":{"env":"T_COUNTERS"},"claims":{"pinboard":{"namespaces":["counters","chat-*"]}}},
		{"name":"none","token":{"env":"T_NONE"}}]}],
		"namespaces":{
			"/public":{"allow":"anonymous"},
			"public-*":{"allow":"anonymous"},
			"/chat-*":{"allow":"authenticated"},
			"/chat-admin*":{"allow":"authenticated","scopes":["app:write"]},
			"/chat-admin-open":{"allow":"anonymous"},
			"/locked":{"allow":"deny"},
			"/gone":{"allow":"none"},
			"/writes":{"allow":"authenticated","scopes":["app:write"]}}}`
	p, err := ParsePassport([]byte(raw), testEnv(map[string]string{"T_ALL": "all", "T_COUNTERS": "counters", "T_NONE": "none"}))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return p
}

func TestAdmit_RTR4(t *testing.T) {
	p := policyTestPassport(t)
	pr := map[string]*Principal{}
	for _, x := range p.Principals() {
		pr[x.Name] = x
	}
	cases := []struct {
		ns   string
		who  string // "" = anonymous
		want Decision
	}{
		// No policy matches: authentication required.
		{"/counters", "", Unauthorized},
		{"/counters", "counters", Allow},
		{"counters", "counters", Allow},
		{"/counters", "all", Allow},
		{"/counters", "none", Forbidden},
		{"/other", "counters", Forbidden},
		// Anonymous: everyone, credential or not.
		{"/public", "", Allow},
		{"/public", "none", Allow},
		{"/public-eu", "", Allow},
		// Globs: the longest matching pattern wins.
		{"/chat-eu", "", Unauthorized},
		{"/chat-eu", "counters", Allow},
		{"/chat-admin", "counters", Forbidden}, // lacks app:write
		{"/chat-admin", "all", Allow},
		{"/chat-admin-x", "", Unauthorized},
		// Exact beats any glob.
		{"/chat-admin-open", "", Allow},
		// Deny: nobody.
		{"/locked", "", Forbidden},
		{"/locked", "all", Forbidden},
		{"/gone", "all", Forbidden},
		// Required scopes.
		{"/writes", "all", Allow},
		{"/writes", "counters", Forbidden},
		{"/writes", "", Unauthorized},
	}
	for _, tc := range cases {
		if got := p.Admit([]byte(tc.ns), pr[tc.who]); got != tc.want {
			t.Errorf("unexpected Admit(%q, %q); got %v; want %v", tc.ns, tc.who, got, tc.want)
		}
	}
}

func TestAdmit_StarPolicy_RTR4(t *testing.T) {
	p, err := ParsePassport([]byte(withPolicies(`{"*":{"allow":"anonymous"},"/private":{"allow":"authenticated"}}`)), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if got := p.Admit([]byte("/anything"), nil); got != Allow {
		t.Fatalf("unexpected decision under \"*\" anonymous; got %v; want allow", got)
	}
	if got := p.Admit([]byte("/private"), nil); got != Unauthorized {
		t.Fatalf("unexpected decision for exact authenticated; got %v; want unauthorized", got)
	}
	if got := p.Admit([]byte("/private"), p.Principals()[0]); got != Allow {
		t.Fatalf("unexpected decision for covered principal; got %v; want allow", got)
	}
}

func TestDecision_String(t *testing.T) {
	for d, want := range map[Decision]string{Allow: "allow", Unauthorized: "unauthorized", Forbidden: "forbidden", 9: "Decision(9)"} {
		if got := d.String(); got != want {
			t.Errorf("unexpected String; got %q; want %q", got, want)
		}
	}
	var zero Decision
	if zero != Unauthorized {
		t.Fatalf("the zero Decision must fail closed")
	}
}

func TestAdmit_ZeroAlloc_RTR4(t *testing.T) {
	p := policyTestPassport(t)
	pr := p.Principals()[0]
	nss := [][]byte{[]byte("/counters"), []byte("/chat-admin-x"), []byte("/public"), []byte("writes")}
	if n := testing.AllocsPerRun(200, func() {
		for _, ns := range nss {
			p.Admit(ns, pr)
			p.Admit(ns, nil)
		}
	}); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

// AdmitCall (R-TR-6): an attested cluster call is admitted to a namespace
// that admits anonymous clients whoever made it, and to any other — deny
// included — only when the account that registered the calling session,
// still in the passport, covers the namespace (R-TR-3).
func TestAdmitCall_RTR6_RTR3(t *testing.T) {
	p := policyTestPassport(t)
	for _, c := range []struct {
		ns, sub string
		want    bool
		missing string // the scope a refusal names
	}{
		{"/public", "p:none", true, ""},
		{"/public", "p:gone", true, ""},
		{"public-x", "p:gone", true, ""},
		{"/counters", "p:counters", true, ""},
		{"counters", "p:counters", true, ""},
		{"/counters", "p:none", false, ""},
		{"/counters", "p:gone", false, ""},
		{"/chat-eu", "p:counters", true, ""},
		{"/chat-eu", "p:none", false, ""},
		{"/locked", "p:all", true, ""},
		{"/locked", "p:counters", false, ""},
		{"/writes", "p:counters", false, ""},
		{"/writes", "p:all", true, ""},
		{"/chat-admin-x", "p:counters", false, "app:write"},
		{"/other", "p:all", true, ""},
		{"/other", "p:counters", false, ""},
	} {
		if got := p.AdmitCall([]byte(c.ns), c.sub); got.OK != c.want || got.MissingScope != c.missing {
			t.Errorf("unexpected AdmitCall(%q, %q); got %+v; want OK %v, MissingScope %q", c.ns, c.sub, got, c.want, c.missing)
		}
	}
}
