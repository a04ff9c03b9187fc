package proxy

import (
	"net/netip"

	"github.com/valyala/fasthttp"
)

// forwardedFor appends every X-Forwarded-For line of h to dst, in order,
// joined by ", " as one list.
func forwardedFor(h *fasthttp.RequestHeader, dst []byte) []byte {
	for k, v := range h.All() {
		if len(k) == len(hdrXFF) && asciiEqualFold(k, "X-Forwarded-For") && len(v) > 0 {
			if len(dst) > 0 {
				dst = append(dst, ", "...)
			}
			dst = append(dst, v...)
		}
	}
	return dst
}

// forwarded is what setForwarded reads of the client's forwarding
// headers (readForwarded): the lines of each, and a trusted peer's last
// Proto and Host values (copies in rq.tmp).
type forwarded struct {
	peer                                netip.Addr
	trusted                             bool
	nFor, nProto, nHost, nOther, nAlias int
	proto, host                         []byte
}

// count counts the forwarding headers of h and returns the last Proto and
// Host values, which alias h.
func (fw *forwarded) count(h *fasthttp.RequestHeader) (proto, host []byte) {
	fw.nFor, fw.nProto, fw.nHost, fw.nOther, fw.nAlias = 0, 0, 0, 0, 0
	for k, v := range h.All() {
		if forwardedAlias(k) {
			fw.nAlias++
			continue
		}
		switch len(k) {
		case len(hdrXFF):
			if asciiEqualFold(k, "X-Forwarded-For") {
				fw.nFor++
			}
		case len(hdrXFProto):
			if asciiEqualFold(k, "X-Forwarded-Proto") {
				fw.nProto, proto = fw.nProto+1, v
			}
		case len(hdrXFHost):
			if asciiEqualFold(k, "X-Forwarded-Host") {
				fw.nHost, host = fw.nHost+1, v
			}
		case len("Forwarded"): // and len("X-Real-IP")
			if asciiEqualFold(k, "Forwarded") || asciiEqualFold(k, "X-Real-IP") {
				fw.nOther++
			}
		}
	}
	return proto, host
}

// readForwarded counts the client's forwarding headers and, from a
// trusted peer, keeps what setForwarded passes on: its X-Forwarded-For
// lines joined in order (rq.xff) and its last Proto and Host lines
// (copied to rq.tmp). It runs before pinboard deletes anything from the
// header: a deletion moves the header's last line into the gap
// (keepFieldOrder), and read after one, the list came out of order and
// an earlier Proto or Host line passed for the last one
// (TestTrustedForwardedReadInClientOrder_RDP1_RPL4). A deletion removes
// every line of a name, so the kept values stay right for each name the
// header still has; counted again (count) after stripRequestHop deleted
// Connection-named headers, the only deletion before setForwarded that
// can take a forwarding header, they say which.
func (p *Proxy) readForwarded(ctx *fasthttp.RequestCtx, rq *request) forwarded {
	h := &ctx.Request.Header
	fw := forwarded{peer: addrOf(ctx.RemoteAddr())}
	fw.trusted = p.trusted.Trusted(fw.peer)
	proto, host := fw.count(h)
	rq.xff = rq.xff[:0]
	if fw.trusted {
		rq.xff = forwardedFor(h, rq.xff)
		rq.tmp = append(append(rq.tmp[:0], proto...), host...)
		fw.proto, fw.host = rq.tmp[:len(proto)], rq.tmp[len(proto):]
	}
	return fw
}

// setForwarded sets X-Forwarded-For/-Proto/-Host from what readForwarded
// read. A peer that is not a trusted proxy cannot smuggle in its own
// values: every copy it sent is replaced — a second X-Forwarded-For or
// -Proto line would otherwise reach the worker beside pinboard's, and
// uvicorn's proxy-headers middleware joins the For lines and takes the
// last Proto — and its Forwarded and X-Real-IP go too. A trusted proxy's
// For lines are joined in order (forwardedFor) before the peer is
// appended, and its last Proto and Host line are kept. Nothing is
// deleted unless there is a copy to remove.
func (p *Proxy) setForwarded(ctx *fasthttp.RequestCtx, rq *request, fw forwarded) {
	h := &ctx.Request.Header
	trusted, proto, host := fw.trusted, fw.proto, fw.host
	if !trusted || fw.nFor == 0 {
		rq.xff = rq.xff[:0]
	} else if len(rq.xff) > 0 {
		rq.xff = append(rq.xff, ", "...)
	}
	if fw.peer.IsValid() {
		rq.xff = fw.peer.AppendTo(rq.xff)
	}
	if !trusted || fw.nProto == 0 {
		proto = valHTTP
		if ctx.IsTLS() {
			proto = valHTTPS
		}
	}
	if !trusted || fw.nHost == 0 {
		host = h.Host()
	}
	ed := editor{h, &rq.order}
	setOnly(ed, hdrXFF, rq.xff, fw.nFor)
	setOnly(ed, hdrXFProto, proto, fw.nProto)
	setOnly(ed, hdrXFHost, host, fw.nHost)
	if !trusted && fw.nOther > 0 {
		ed.Del("Forwarded")
		ed.Del("X-Real-IP")
	}
	if fw.nAlias > 0 {
		delForwardedAliases(ed)
	}
}

// rewriteRequest makes the client's header the worker's, for a request
// (forward) or a WebSocket handshake (serveWebSocket, keepUpgrade): the
// hop-by-hop, Connection-named and reserved headers stripped, a passport
// credential pinboard consumed removed (R-TR-4), the forwarding headers
// set, then the order of repeated fields and the client's Cookie lines
// put back. Every deletion goes through an editor, which marks the field
// order for repair.
func (p *Proxy) rewriteRequest(ctx *fasthttp.RequestCtx, rq *request, keepUpgrade bool) {
	h := &ctx.Request.Header
	fw := p.readForwarded(ctx, rq) // before a deletion moves lines
	stripRequestHop(h, rq, rq.hop, keepUpgrade)
	if rq.hop&hopNamed != 0 {
		fw.count(h) // the Connection-named deletions may have taken forwarding headers
	}
	if rq.passport {
		editor{h, &rq.order}.DelBytes(hdrAuthorization)
	}
	p.setForwarded(ctx, rq, fw)
	keepFieldOrder(h, rq)
	restoreCookies(h, rq)
}

// delForwardedAliases removes the underscored aliases of the forwarding
// headers (underscoreAlias) from every request, a trusted proxy's too: no
// proxy spells them so (nginx drops underscored names by default). Rare:
// the names are copied.
func delForwardedAliases(ed editor) {
	var names []string
	for k := range ed.All() {
		if forwardedAlias(k) {
			names = append(names, string(k))
		}
	}
	for _, n := range names {
		ed.Del(n)
	}
}

// forwardedAlias reports whether k is an underscored alias of a
// forwarding header pinboard sets or removes.
func forwardedAlias(k []byte) bool {
	for _, n := range [...]string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP"} {
		if underscoreAlias(k, n) {
			return true
		}
	}
	return false
}

// setOnly leaves key with the single value v (none when v is empty), the
// header holding n copies of it now; v must not alias one of them.
func setOnly(ed editor, key, v []byte, n int) {
	if n > 1 || (n == 1 && len(v) == 0) {
		ed.DelBytes(key)
	}
	if len(v) > 0 {
		ed.h.SetCanonical(key, v)
	}
}
