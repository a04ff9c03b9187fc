package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts a cluster of n masters (n >= 3, as redis-cli requires)
// for this test and waits until every node reports cluster_state:ok;
// t.Cleanup kills the nodes.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	c, err := StartClusterIn(t.TempDir(), masters)
	if err != nil {
		t.Fatalf("cannot start a redis cluster: %v", err)
	}
	t.Cleanup(c.Kill)
	return c
}

// StartClusterIn is StartCluster for programs that are not tests; the
// caller must Kill the cluster.
func StartClusterIn(dir string, masters int) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("a cluster needs at least 3 masters, got %d", masters)
	}
	_, cli, err := Binaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for range masters {
		s, err := Start(dir, true)
		if err != nil {
			c.Kill()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Kill()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

// waitOK polls CLUSTER INFO on every node until all say cluster_state:ok
// and know every master.
func (c *Cluster) waitOK(ctx context.Context) error {
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.Nodes))
	for {
		ok := true
		var last string
		for _, n := range c.Nodes {
			info, err := n.Do("CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, want) {
				ok, last = false, info
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ok after %v: %s", clusterTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is redis+cluster://host:port,host:port,… naming every master.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// FlushAll runs FLUSHALL on every master.
func (c *Cluster) FlushAll() error {
	var errs []error
	for _, n := range c.Nodes {
		if err := n.FlushAll(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NodeFor returns the master serving key's slot (CLUSTER KEYSLOT, then the
// node whose CLUSTER NODES line owns that slot).
func (c *Cluster) NodeFor(key string) (*Server, error) {
	slotText, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, err
	}
	slot, err := strconv.Atoi(strings.TrimSpace(slotText))
	if err != nil {
		return nil, fmt.Errorf("cannot parse CLUSTER KEYSLOT %q: %w", slotText, err)
	}
	nodes, err := c.Nodes[0].Do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		addr := f[1]
		if i := strings.IndexByte(addr, '@'); i >= 0 {
			addr = addr[:i]
		}
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || slot < a || slot > b {
				continue
			}
			for _, n := range c.Nodes {
				if n.Addr == addr {
					return n, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no master serves slot %d of %q", slot, key)
}

// Kill stops every node.
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}
