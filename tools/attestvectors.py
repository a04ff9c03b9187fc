#!/usr/bin/env python3
"""Print R-TR-5 attestation test vectors from the reference worker, as JSON.

pinboard must mint attestations the reference worker (the Python package
`pinned`) accepts, and its Go stand-in worker must accept exactly what the
reference accepts. This script asks the reference itself, so the Go tests in
attest/ can check both without Python installed:

    /tmp/pv/bin/python tools/attestvectors.py > attest/testdata/vectors.json

Sections:
  mint    tokens minted by pinned.pinboard.attestation.mint_attestation, and
          tokens in the Go format with "acct" (which the reference mint has
          no parameter for) built here and checked with verify_attestation;
          AppendAttestation must reproduce every one byte for byte.
  verify  correctly and incorrectly signed tokens with the reference
          verify_attestation's verdict ("accept", "reject", or "raise" when
          it raises, which fails the worker's request).
  acct    passports and the acct object the reference expects for each key.
  base64  token segments and what the reference's _b64url_decode makes of
          them (hex, or null where it raises).
  json    byte strings (standard base64) and the type json.loads makes of
          them, or null where it raises (mutation corpus).

The output is deterministic: rerunning it against the same pinned version
must not change the file.
"""

import base64
import hashlib
import hmac
import importlib
import json
import random
import sys

# Not `from pinned.pinboard import attestation`: the package re-exports a
# function of that name, which shadows the module.
ref = importlib.import_module("pinned.pinboard.attestation")

try:
    from importlib.metadata import version

    PINNED_VERSION = version("pinned")
except Exception:  # pragma: no cover - metadata missing in odd installs
    PINNED_VERSION = "unknown"

SECRET = "4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b"
LONG_SECRET = "x" * 100  # longer than a SHA-256 block: HMAC hashes the key
UNICODE_SECRET = "sécret-ключ"
OTHER_SECRET = "0" * 64
AUD = "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0"
IAT = 1_700_000_000
NOW = IAT + 0.25


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def compact(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sign(secret: str, hseg: str, pseg: str) -> str:
    """A token over arbitrary segments, signed the reference's way."""
    mac = hmac.new(secret.encode(), f"{hseg}.{pseg}".encode(), hashlib.sha256)
    return f"{hseg}.{pseg}.{b64(mac.digest())}"


HEADER = compact({"alg": "HS256", "typ": "pinboard+jwt"})


def token_from(payload: bytes, *, header: bytes = HEADER, secret: str = SECRET) -> str:
    return sign(secret, b64(header), b64(payload))


def claims_bytes(**extra) -> bytes:
    claims = {"aud": AUD, "iat": IAT, "exp": IAT + ref.ATTESTATION_TTL_S}
    claims.update(extra)
    return compact(claims)


def verdict(token, secret, audiences, now):
    try:
        claims = ref.verify_attestation(token, secret=secret, audiences=audiences, now=now)
    except Exception as exc:  # the worker's request fails: never accepted
        return "raise", type(exc).__name__, None
    if claims is None:
        return "reject", None, None
    return "accept", None, claims


def expect_of(claims):
    """The accepted claims in a form Go can compare (ints as decimal text)."""
    out = {"aud": claims["aud"], "iat": str(claims["iat"]), "exp": str(claims["exp"])}
    if "caller" in claims:
        out["caller"] = claims["caller"]
    if "depth" in claims:
        out["depth"] = str(claims["depth"])
    if "acct" in claims:
        acct = claims["acct"]
        out["acct"] = {"sub": acct["sub"], "scopes": acct.get("scopes")}
    return out


# --- mint -------------------------------------------------------------------


def mint_vectors():
    out = []
    cases = [
        ("minimal", SECRET, AUD, NOW, None, None),
        ("caller_depth0", SECRET, AUD, NOW, "/counters/alice", 0),
        ("caller_depth3", SECRET, AUD, NOW + 0.99, "/counters/bob", 3),
        ("depth_without_caller", SECRET, AUD, NOW, None, 2),
        ("long_secret", LONG_SECRET, AUD, NOW, None, None),
        ("unicode_secret", UNICODE_SECRET, AUD, NOW, None, None),
        ("escaped_caller", SECRET, AUD, NOW, '/q"uo\\te/\n\t\x01\x7f', 1),
        ("non_ascii_caller", SECRET, AUD, NOW, "/zähler/😀ü", 1),
        ("non_ascii_aud", SECRET, "sessión-✓", NOW, None, None),
        ("empty_aud", SECRET, "", NOW, None, None),
        ("zero_time", SECRET, AUD, 0.0, None, None),
        ("truncated_now", SECRET, AUD, 1_999_999_999.999, "/a/b", 7),
    ]
    for name, secret, aud, now, caller, depth in cases:
        token = ref.mint_attestation(secret, aud=aud, now=now, caller=caller, depth=depth)
        assert ref.verify_attestation(token, secret=secret, audiences={aud}, now=now)
        out.append(
            {
                "name": name,
                "secret": secret,
                "aud": aud,
                "now": now,
                "iat": int(now),
                "caller": caller,
                "depth": depth,
                "acct": None,
                "token": token,
            }
        )
    # Go-format tokens with acct: same key order as mint_attestation, acct last.
    accts = [
        ("acct", {"sub": "pinboard:deployment", "scopes": ["pinboard:worker"], "claims": {}}, None, None),
        (
            "acct_with_caller",
            {
                "sub": "pinboard:deployment",
                "scopes": ["pinboard:worker", "pinboard:operator"],
                "claims": {"pinboard": {"namespaces": ["*"], "allowedBackendHosts": ["*"]}},
            },
            "/counters/alice",
            0,
        ),
        ("acct_unicode", {"sub": "p:ключ", "scopes": [], "claims": {"team": "ünï", "n": [1, 2.5, None, True]}}, None, None),
    ]
    for name, acct, caller, depth in accts:
        iat = int(NOW)
        claims = {"aud": AUD, "iat": iat, "exp": iat + ref.ATTESTATION_TTL_S}
        if caller is not None:
            claims["caller"] = caller
        if depth is not None:
            claims["depth"] = depth
        acct_json = compact(acct).decode()
        claims["acct"] = acct
        token = token_from(compact(claims))
        got = ref.verify_attestation(token, secret=SECRET, audiences={AUD}, now=NOW)
        assert got is not None and got["acct"] == acct, name
        out.append(
            {
                "name": name,
                "secret": SECRET,
                "aud": AUD,
                "now": NOW,
                "iat": iat,
                "caller": caller,
                "depth": depth,
                "acct": acct_json,
                "token": token,
            }
        )
    return out


# --- verify -----------------------------------------------------------------


def verify_vectors():
    cases = []

    def add(name, token, *, secret=SECRET, audiences=(AUD,), now=NOW):
        cases.append((name, token, secret, list(audiences), now))

    good = ref.mint_attestation(SECRET, aud=AUD, now=NOW)
    add("valid_minimal", good)
    add("valid_caller_depth", ref.mint_attestation(SECRET, aud=AUD, now=NOW, caller="/counters/alice", depth=0))
    add("valid_long_secret", ref.mint_attestation(LONG_SECRET, aud=AUD, now=NOW), secret=LONG_SECRET)
    add("valid_unicode_secret", ref.mint_attestation(UNICODE_SECRET, aud=AUD, now=NOW), secret=UNICODE_SECRET)
    add("wrong_key", ref.mint_attestation(OTHER_SECRET, aud=AUD, now=NOW))
    add("aud_second_of_many", good, audiences=("local-aud", AUD))
    add("wrong_aud", good, audiences=("someone-else",))
    add("no_audiences", good, audiences=())

    # Time window: iat - 30 <= now <= exp + 30.
    exp = IAT + ref.ATTESTATION_TTL_S
    add("now_at_iat_minus_skew", good, now=float(IAT - ref.CLOCK_SKEW_S))
    add("now_before_iat_minus_skew", good, now=IAT - ref.CLOCK_SKEW_S - 0.5)
    add("now_iat_minus_31", good, now=float(IAT - 31))
    add("now_at_exp_plus_skew", good, now=float(exp + ref.CLOCK_SKEW_S))
    add("now_just_after_exp_plus_skew", good, now=exp + ref.CLOCK_SKEW_S + 0.001)
    add("expired_beyond_skew", good, now=float(exp + ref.CLOCK_SKEW_S + 1))
    add("iat_in_future_beyond_skew", ref.mint_attestation(SECRET, aud=AUD, now=NOW + 31), now=NOW - 0.5)
    add("exp_before_iat_still_in_window", token_from(claims_bytes(exp=IAT - 20)))

    # Claim types.
    P = lambda **kw: token_from(claims_bytes(**kw))  # noqa: E731
    add("aud_missing", token_from(compact({"iat": IAT, "exp": exp})))
    add("aud_int", P(aud=5))
    add("aud_null", P(aud=None))
    add("aud_list_raises", P(aud=[AUD]))
    add("aud_object_raises", P(aud={"a": 1}))
    add("iat_float", token_from(claims_bytes().replace(b'"iat":1700000000', b'"iat":1700000000.0')))
    add("iat_exponent", token_from(claims_bytes().replace(b'"iat":1700000000', b'"iat":17e8')))
    add("iat_bool", P(iat=True))
    add("iat_string", P(iat=str(IAT)))
    add("iat_missing", token_from(compact({"aud": AUD, "exp": exp})))
    add("exp_missing", token_from(compact({"aud": AUD, "iat": IAT})))
    add("exp_null", P(exp=None))
    add("iat_negative_zero", token_from(compact({"aud": AUD, "iat": 0, "exp": 30}).replace(b'"iat":0', b'"iat":-0')), now=10.0)
    add("exp_huge", P(exp=10**30))
    add("exp_huge_negative", P(exp=-(10**30)))
    add("iat_huge", P(iat=10**30))
    add("iat_huge_negative", P(iat=-(10**30)))
    add("depth_bool", P(depth=True))
    add("depth_false", P(depth=False))
    add("depth_float", token_from(claims_bytes(depth=1).replace(b'"depth":1', b'"depth":1.0')))
    add("depth_null", P(depth=None))
    add("depth_string", P(depth="1"))
    add("depth_negative", P(depth=-4))
    add("depth_huge", P(depth=10**25))
    add("caller_null", P(caller=None))
    add("caller_int", P(caller=7))
    add("caller_empty", P(caller=""))
    add("caller_list", P(caller=["/a/b"]))

    # acct.
    add("acct_valid", P(acct={"sub": "pinboard:deployment", "scopes": ["pinboard:worker"], "claims": {"pinboard": {}}}))
    add("acct_sub_only", P(acct={"sub": "x"}))
    add("acct_empty_scopes", P(acct={"sub": "x", "scopes": []}))
    add("acct_without_sub", P(acct={"scopes": ["a"]}))
    add("acct_sub_int", P(acct={"sub": 1}))
    add("acct_sub_null", P(acct={"sub": None}))
    add("acct_list", P(acct=["x"]))
    add("acct_null", P(acct=None))
    add("acct_string", P(acct="pinboard:deployment"))
    add("acct_scopes_null", P(acct={"sub": "x", "scopes": None}))
    add("acct_scopes_string", P(acct={"sub": "x", "scopes": "a"}))
    add("acct_scopes_non_string", P(acct={"sub": "x", "scopes": ["a", 1]}))
    add("acct_claims_list", P(acct={"sub": "x", "claims": []}))
    add("acct_claims_null", P(acct={"sub": "x", "claims": None}))
    add("acct_claims_nested", P(acct={"sub": "x", "claims": {"a": {"b": [1, {"c": None}]}}}))

    # Header.
    H = lambda obj: token_from(claims_bytes(), header=compact(obj))  # noqa: E731
    add("header_alg_none", H({"alg": "none", "typ": "pinboard+jwt"}))
    add("header_alg_hs512", H({"alg": "HS512", "typ": "pinboard+jwt"}))
    add("header_typ_jwt", H({"alg": "HS256", "typ": "JWT"}))
    add("header_extra_kid", H({"alg": "HS256", "typ": "pinboard+jwt", "kid": "1"}))
    add("header_missing_typ", H({"alg": "HS256"}))
    add("header_reordered", H({"typ": "pinboard+jwt", "alg": "HS256"}))
    add("header_array", H(["HS256", "pinboard+jwt"]))
    add("header_spaces", token_from(claims_bytes(), header=b' { "alg" : "HS256" ,\n"typ":"pinboard+jwt" } '))
    add("header_escaped", token_from(claims_bytes(), header=b'{"alg":"HS\\u0032\\u00356","typ":"pinboard\\u002bjwt"}'))
    add("header_duplicate_last_good", token_from(claims_bytes(), header=b'{"alg":"none","alg":"HS256","typ":"pinboard+jwt"}'))
    add("header_duplicate_last_bad", token_from(claims_bytes(), header=b'{"alg":"HS256","alg":"none","typ":"pinboard+jwt"}'))
    add("header_alg_trailing_space", H({"alg": "HS256 ", "typ": "pinboard+jwt"}))
    add("header_alg_lowercase", H({"alg": "hs256", "typ": "pinboard+jwt"}))
    add("header_not_json", token_from(claims_bytes(), header=b"HS256"))

    # Payload JSON as Python's json.loads reads it.
    C = claims_bytes()
    R = lambda payload: token_from(payload)  # noqa: E731
    add("payload_array", R(compact([AUD, IAT])))
    add("payload_string", R(compact("claims")))
    add("payload_number", R(b"42"))
    add("payload_not_json", R(b"not json"))
    add("payload_empty", R(b""))
    add("payload_trailing_garbage", R(C + b"x"))
    add("payload_trailing_space", R(C + b" \n\t\r"))
    add("payload_leading_space", R(b" \n" + C))
    add("payload_trailing_comma", R(C[:-1] + b",}"))
    add("payload_single_quotes", R(C.replace(b'"aud"', b"'aud'")))
    add("payload_nan_extra", R(C[:-1] + b',"x":NaN}'))
    add("payload_infinity_extra", R(C[:-1] + b',"x":[Infinity,-Infinity]}'))
    add("payload_big_float_extra", R(C[:-1] + b',"x":1e999}'))
    add("payload_int_4300_digits", R(C[:-1] + b',"x":' + b"9" * 4300 + b"}"))
    add("payload_int_4301_digits", R(C[:-1] + b',"x":' + b"9" * 4301 + b"}"))
    add("payload_negative_int_4300_digits", R(C[:-1] + b',"x":-' + b"9" * 4300 + b"}"))
    add("payload_float_5000_digits", R(C[:-1] + b',"x":1.' + b"9" * 5000 + b"}"))
    add("payload_duplicate_iat_last_int", R((C[:-1] + b',"iat":1700000000}').replace(b'"iat":1700000000,', b'"iat":1.5,', 1)))
    add("payload_duplicate_iat_last_float", R(C[:-1] + b',"iat":1.5}'))
    add("payload_utf8_bom", R(b"\xef\xbb\xbf" + C))
    add("payload_double_utf8_bom", R(b"\xef\xbb\xbf\xef\xbb\xbf" + C))
    add("payload_utf16_bom", R(C.decode().encode("utf-16")))
    add("payload_utf16le", R(C.decode().encode("utf-16-le")))
    add("payload_utf16be", R(C.decode().encode("utf-16-be")))
    add("payload_utf32_bom", R(C.decode().encode("utf-32")))
    add("payload_utf32le", R(C.decode().encode("utf-32-le")))
    add("payload_utf32be", R(C.decode().encode("utf-32-be")))
    add("payload_utf16_odd_length", R(C.decode().encode("utf-16-le") + b"\x00"))
    add("payload_invalid_utf8", R(C[:-1] + b',"x":"\xff"}'))
    add("payload_overlong_utf8", R(C[:-1] + b',"x":"\xc0\xaf"}'))
    add("payload_encoded_surrogate", R(C[:-1] + b',"x":"\xed\xa0\x80"}'))
    add("payload_lone_surrogate_escape", R(C[:-1] + b',"x":"\\ud800"}'))
    add("payload_surrogate_pair_escape", R(C[:-1] + b',"x":"\\ud83d\\ude00"}'))
    add("payload_raw_control_char", R(C[:-1] + b',"x":"a\x01b"}'))
    add("payload_raw_del", R(C[:-1] + b',"x":"a\x7fb"}'))
    add("payload_escaped_control", R(C[:-1] + b',"x":"a\\u0000b"}'))
    add("payload_invalid_escape", R(C[:-1] + b',"x":"\\x41"}'))
    add("payload_short_unicode_escape", R(C[:-1] + b',"x":"\\u12"}'))
    add("payload_nested_50", R(C[:-1] + b',"x":' + b"[" * 50 + b"]" * 50 + b"}"))
    add("payload_nested_5000_raises", R(C[:-1] + b',"x":' + b"[" * 5000 + b"]" * 5000 + b"}"))
    add("payload_aud_escaped", R(C.replace(AUD.encode(), b"\\u%04x" % ord(AUD[0]) + AUD[1:].encode())))
    add("payload_aud_lone_surrogate", R(C.replace(AUD.encode(), AUD.encode() + b"\\udc00")))
    add("payload_leading_zero", R(C.replace(b'"iat":1700000000', b'"iat":01700000000')))
    add("payload_plus_sign", R(C.replace(b'"iat":1700000000', b'"iat":+1700000000')))
    add("payload_dot_without_digits", R(C.replace(b'"iat":1700000000', b'"iat":1700000000.')))
    add("payload_e_without_digits", R(C.replace(b'"iat":1700000000', b'"iat":1700000000e')))

    # Segment encodings, as the reference's lenient base64 reads them.
    hseg, pseg = b64(HEADER), b64(C)
    add("segment_padded", sign(SECRET, hseg + "=" * (-len(hseg) % 4), pseg + "=" * (-len(pseg) % 4)))
    add("segment_extra_padding", sign(SECRET, hseg + "====", pseg))
    odd = b64(claims_bytes(x="?" * 12 + ">" * 12 + "~" * 12))
    assert "-" in odd and "_" in odd
    add("segment_url_alphabet", sign(SECRET, hseg, odd))
    add("segment_standard_alphabet", sign(SECRET, hseg, odd.replace("-", "+").replace("_", "/")))
    add("segment_junk_chars", sign(SECRET, hseg[:5] + "!~ " + hseg[5:], pseg[:7] + "*" + pseg[7:]))
    add("segment_junk_chars_aligned", sign(SECRET, hseg[:5] + "!~ *" + hseg[5:], pseg[:7] + "*!~ " + pseg[7:]))
    add("segment_padding_midway", sign(SECRET, hseg, pseg[:8] + "==" + pseg[8:]))
    spaced = b64(HEADER + b" ")
    assert len(spaced) % 4 == 2
    add("segment_data_after_padding", sign(SECRET, spaced + "==QUJD", pseg))
    add("segment_single_pad_then_data", sign(SECRET, spaced + "=QUJD", pseg))
    add("segment_one_extra_char", sign(SECRET, hseg, pseg + "A" * ((1 - len(pseg)) % 4)))
    add("segment_empty_header", sign(SECRET, "", pseg))

    # Structure.
    h, p, s = good.split(".")
    add("two_segments", f"{h}.{p}")
    add("four_segments", f"{good}.x")
    add("empty_token", "")
    add("signature_padded", good + "=")
    add("signature_standard_alphabet", f"{h}.{p}.{s.replace('-', '+').replace('_', '/')}" if ("-" in s or "_" in s) else f"{h}.{p}.{s[:-1]}")
    add("signature_flipped_case", f"{h}.{p}.{s.swapcase()}")
    add("signature_truncated", good[:-1])
    add("non_ascii_payload_segment_signed", sign(SECRET, h, p + "é"))
    add("non_ascii_signature_raises", f"{h}.{p}.{s[:-1]}é")

    out = []
    for name, token, secret, audiences, now in cases:
        result, exc, claims = verdict(token, secret, set(audiences), now)
        entry = {
            "name": name,
            "token": token,
            "secret": secret,
            "audiences": audiences,
            "now": now,
            "result": result,
        }
        if exc:
            entry["raises"] = exc
        if claims is not None:
            entry["expect"] = expect_of(claims)
        out.append(entry)
    return out


# --- acct -------------------------------------------------------------------


def acct_vectors():
    passports = [
        {
            "providers": [
                {
                    "type": "staticToken",
                    "id": "pinboard",
                    "keys": [
                        {
                            "name": "deployment",
                            "token": {"env": "PINBOARD_TOKEN"},
                            "scopes": ["pinboard:worker", "pinboard:operator"],
                            "claims": {"pinboard": {"namespaces": ["*"], "allowedBackendHosts": ["*"]}},
                        },
                        {
                            "name": "client",
                            "token": {"env": "CLIENT_TOKEN"},
                            "scopes": ["app:read", "app:read"],
                            "claims": {
                                "team": "ünï ✓ 😀",
                                "quota": [1, 2.5, None, True, {"deep": {"z": 1, "a": 2}}],
                                "pinboard": {"namespaces": ["/counters"], "envs": ["prod"]},
                            },
                        },
                        {"name": "bare", "token": {"env": "BARE_TOKEN"}},
                    ],
                }
            ],
            "namespaces": {"*": {"allow": "authenticated"}},
        }
    ]
    env = {"PINBOARD_TOKEN": "tok-deployment", "CLIENT_TOKEN": "tok-client", "BARE_TOKEN": "tok-bare"}
    out = []
    for passport in passports:
        keys = []
        for provider in passport["providers"]:
            for key in provider["keys"]:
                scopes = list(dict.fromkeys(key.get("scopes", [])))
                acct = {"sub": f"{provider['id']}:{key['name']}", "scopes": scopes, "claims": key.get("claims", {})}
                acct_json = compact(acct).decode()
                iat = int(NOW)
                claims = {"aud": AUD, "iat": iat, "exp": iat + ref.ATTESTATION_TTL_S, "acct": acct}
                token = token_from(compact(claims))
                got = ref.verify_attestation(token, secret=SECRET, audiences={AUD}, now=NOW)
                assert got is not None and got["acct"] == acct
                keys.append({"sub": acct["sub"], "acctJson": acct_json, "token": token})
        out.append({"passport": json.dumps(passport, ensure_ascii=False), "env": env, "secret": SECRET, "aud": AUD, "iat": int(NOW), "keys": keys})
    return out


# --- base64 -----------------------------------------------------------------


def base64_vectors():
    rng = random.Random(5)
    alphabet = "AQgw_-+/=9z!~ *"
    segments = ["", "=", "==", "A", "AA", "AAA", "AAAA", "AB=CDAB=", "AB=CDAB==", "AA==AAAA", "A===BC==", "ABC=D", "QQ", "QUI", "QUJD", "QQ==", "QQ=", "Q=Q=", "_-_-", "+/+/"]
    for _ in range(600):
        n = rng.randrange(0, 14)
        segments.append("".join(rng.choice(alphabet) for _ in range(n)))
    out = []
    seen = set()
    for seg in segments:
        if seg in seen:
            continue
        seen.add(seg)
        try:
            decoded = ref._b64url_decode(seg).hex()
        except Exception:
            decoded = None
        out.append({"segment": seg, "hex": decoded})
    return out


# --- json -------------------------------------------------------------------


def json_vectors():
    rng = random.Random(7)
    seeds = [
        claims_bytes(),
        claims_bytes(caller="/counters/alice", depth=0, acct={"sub": "a:b", "scopes": ["x"], "claims": {"k": [1, 2.5e3, None, True, False]}}),
        b'{"a":"\\ud83d\\ude00\\u00e9\\n","b":[NaN,Infinity,-Infinity,-0,0.5e-3]}',
        b'[1, "two", {"three": [3]}, null]',
        b'"\\u0041\\/\\b\\f\\r\\t\\"\\\\"',
        '{"ü":"✓"}'.encode(),
        b"-12.5E+7",
        b"  true  ",
    ]
    seeds += [s.decode().encode(enc) for s in seeds[2:5] for enc in ("utf-16", "utf-16-le", "utf-32-be")]
    pieces = [b'"', b"\\", b"u", b"{", b"}", b"[", b"]", b",", b":", b" ", b"\t", b"\n", b"0", b"1", b"-", b"+", b".",
              b"e", b"E", b"N", b"I", b"a", b"\x00", b"\x1f", b"\x7f", b"\xc3", b"\xa9", b"\xed", b"\xa0", b"\x80",
              b"\xff", b"\xfe", b"\xef\xbb\xbf", b"d800", b"NaN", b"null", b"true", b"\\ud800", b"\\udc00", b"\\u"]
    samples = list(seeds)
    for _ in range(1000):
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(4)
            pos = rng.randrange(len(b) + 1)
            if op == 0:
                b[pos:pos] = rng.choice(pieces)
            elif op == 1 and b:
                del b[pos:pos + rng.randrange(1, 4)]
            elif op == 2 and b:
                b[min(pos, len(b) - 1)] = rng.choice(pieces)[0]
            else:
                end = min(len(b), pos + rng.randrange(1, 6))
                b[pos:pos] = b[pos:end]
        samples.append(bytes(b))
    out = []
    seen = set()
    for s in samples:
        if s in seen:
            continue
        seen.add(s)
        try:
            value = json.loads(s)
            kind = type(value).__name__
        except Exception:
            kind = None
        out.append({"b64": base64.b64encode(s).decode(), "type": kind})
    return out


def main():
    vectors = {
        "comment": "Generated by tools/attestvectors.py from the reference worker; do not edit.",
        "pinned": PINNED_VERSION,
        "python": sys.version.split()[0],
        "ttl": ref.ATTESTATION_TTL_S,
        "skew": ref.CLOCK_SKEW_S,
        "mint": mint_vectors(),
        "verify": verify_vectors(),
        "acct": acct_vectors(),
        "base64": base64_vectors(),
        "json": json_vectors(),
    }
    json.dump(vectors, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
