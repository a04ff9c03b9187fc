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

// Cluster is a Redis Cluster of masters, with replicas when started by
// StartClusterReplicas.
type Cluster struct {
	// Nodes are every node, masters and replicas, in start order; which
	// is which changes with failovers (Master, ReplicaOf).
	Nodes []*Server
}

// StartCluster starts a cluster of n masters (n >= 3, as redis-cli requires)
// for this test and waits until every node reports cluster_state:ok;
// t.Cleanup kills the nodes.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterReplicas(t, masters, 0)
}

// StartClusterReplicas is StartCluster with replicas replicas per master
// (redis-cli --cluster-replicas), waiting as well until every replica's
// link to its master is up, so that a CLUSTER FAILOVER can start at once.
func StartClusterReplicas(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	c, err := startClusterIn(t.TempDir(), masters, replicas)
	if err != nil {
		t.Fatalf("cannot start a redis cluster: %v", err)
	}
	t.Cleanup(c.Kill)
	return c
}

// StartClusterIn is StartCluster for programs that are not tests; the
// caller must Kill the cluster.
func StartClusterIn(dir string, masters int) (*Cluster, error) {
	return startClusterIn(dir, masters, 0)
}

func startClusterIn(dir string, masters, replicas int) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("a cluster needs at least 3 masters, got %d", masters)
	}
	_, cli, err := Binaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for range masters * (1 + replicas) {
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
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
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
// and know every node, and INFO replication on every replica until its
// link to its master is up.
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
			repl, err := n.Info("replication")
			if err != nil || (repl["role"] == "slave" && repl["master_link_status"] != "up") {
				ok, last = false, fmt.Sprint(repl, err)
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
// The first node that answers is asked: one may have been stopped.
func (c *Cluster) NodeFor(key string) (*Server, error) {
	var slotText string
	var err error
	var asked *Server
	for _, n := range c.Nodes {
		if slotText, err = n.Do("CLUSTER", "KEYSLOT", key); err == nil {
			asked = n
			break
		}
	}
	if err != nil {
		return nil, err
	}
	slot, err := strconv.Atoi(strings.TrimSpace(slotText))
	if err != nil {
		return nil, fmt.Errorf("cannot parse CLUSTER KEYSLOT %q: %w", slotText, err)
	}
	nodes, err := asked.Do("CLUSTER", "NODES")
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

// Master returns the node that is master of the replica r now, from r's
// INFO replication (its master_host and master_port).
func (c *Cluster) Master(r *Server) (*Server, error) {
	info, err := r.Info("replication")
	if err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if strconv.Itoa(n.Port) == info["master_port"] {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%s is no replica of a node of this cluster: %v", r.Addr, info)
}

// ReplicaOf returns a node that CLUSTER NODES, as m sees it, lists as a
// replica of the master m.
func (c *Cluster) ReplicaOf(m *Server) (*Server, error) {
	id, err := m.Do("CLUSTER", "MYID")
	if err != nil {
		return nil, err
	}
	nodes, err := m.Do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.Contains(f[2], "slave") || f[3] != strings.TrimSpace(id) || strings.Contains(f[2], "fail") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, n := range c.Nodes {
			if n.Addr == addr {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("master %s has no replica: %s", m.Addr, nodes)
}

// MasterAndReplica returns the master serving key's slot and a replica
// of it, once the replica has applied everything the master had written
// (WaitReplicated): what a failover test kills or promotes.
func (c *Cluster) MasterAndReplica(key string) (master, replica *Server, err error) {
	if master, err = c.NodeFor(key); err != nil {
		return nil, nil, err
	}
	if replica, err = c.ReplicaOf(master); err != nil {
		return nil, nil, err
	}
	if err = WaitReplicated(master, replica, 10*time.Second); err != nil {
		return nil, nil, err
	}
	return master, replica, nil
}

// WaitRole waits up to timeout until s's INFO replication says
// role:<role> ("master" once promoted, "slave" once demoted).
func (s *Server) WaitRole(role string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		info, err := s.Info("replication")
		if err == nil && info["role"] == role {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not %s after %v: %v %v", s.Addr, role, timeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops every node.
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}
