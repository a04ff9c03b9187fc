package directory

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// strs reads an array of bulk strings; nil elements become "".
func strs(ms []rueidis.RedisMessage) []string {
	out := make([]string, len(ms))
	for i := range ms {
		out[i], _ = ms[i].ToString()
	}
	return out
}

// arr reads a nested array; anything else is empty.
func arr(m rueidis.RedisMessage) []rueidis.RedisMessage {
	a, _ := m.ToArray()
	return a
}

// infoFields is the length of the info tuple of redis_lib.lua.
const infoFields = 18

// decodeInfo reads the info tuple (redis_lib.lua: info).
func decodeInfo(f []string) (SessionInfo, bool) {
	if len(f) < infoFields || f[1] == "" {
		return SessionInfo{}, false
	}
	epoch, _ := strconv.ParseInt(f[8], 10, 64)
	hr, _ := strconv.ParseFloat(f[11], 64)
	placements, _ := strconv.Atoi(f[14])
	info := SessionInfo{
		SessionID:    f[0],
		ClientID:     f[1],
		Sub:          f[2],
		Secret:       f[3],
		AdvertiseURL: f[4],
		Namespaces:   splitNamespaces(f[5]),
		Hostname:     f[6],
		Env:          f[7],
		Epoch:        epoch,
		RegisteredAt: fromMicros(f[9]),
		LeaseUntil:   fromMicros(f[10]),
		Headroom:     hr,
		Draining:     f[12] == "1",
		Placements:   placements,
	}
	if f[13] != "0" && f[13] != "" {
		info.Degraded, info.DegradedSince = true, fromMicros(f[13])
	}
	if f[15] == "1" {
		info.Drain = DrainState{Draining: true, Deadline: fromMicros(f[16])}
	}
	if f[17] != "" && f[17] != "{}" {
		_ = json.Unmarshal([]byte(f[17]), &info.Envs)
	}
	return info, true
}

// splitNamespaces reads the namespaces Register joined with single spaces.
// Only the space separates them: a namespace may hold any other byte but
// "/" (the registry's ^/[^/\s]+$ lets a vertical tab or a Unicode space
// through), so strings.Fields, or Lua's %S, would split one namespace in
// several (the scripts split on the space alone too).
func splitNamespaces(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, " ")
}

// encodeMessage stores a control message as
// "<msgId> <deadline µs or -> <ns>\x00<id>": the script matches acks on the
// first 16 bytes.
func encodeMessage(m ControlMessage) string {
	deadline := "-"
	if m.Deadline != nil {
		deadline = micros(*m.Deadline)
	}
	return m.MsgID + " " + deadline + " " + m.NS + "\x00" + m.ID
}

func decodeMessage(s string) (ControlMessage, bool) {
	msgID, rest, ok := strings.Cut(s, " ")
	if !ok {
		return ControlMessage{}, false
	}
	deadline, target, ok := strings.Cut(rest, " ")
	if !ok {
		return ControlMessage{}, false
	}
	ns, id, ok := strings.Cut(target, "\x00")
	if !ok {
		return ControlMessage{}, false
	}
	m := ControlMessage{MsgID: msgID, Type: "wind_down", NS: ns, ID: id}
	if deadline != "-" {
		t := fromMicros(deadline)
		if t.IsZero() {
			t = time.Unix(0, 0)
		}
		m.Deadline = &t
	}
	return m, true
}
