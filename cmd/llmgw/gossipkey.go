package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// Gossip carries deployments (image, args, env), and every node runs what
// they say: whoever can send to an unencrypted gossip port, a local
// process included, runs code on every node. So a node never gossips in
// the clear unless told to with --insecure-gossip.

// resolveGossipKey decides the key of a node whose flags are valid
// (nodeConfig read --gossip-key-file into cfg.GossipKey already), in this
// order: --gossip-key-file; the key in the data dir (one this node made
// before, or one an operator copied there); a new key when the node starts
// a new cluster (no --join and no peers remembered in node.json). A node
// that joins a cluster with no key is refused: a key of its own would cut
// it off from the cluster, and so would running without one.
func resolveGossipKey(cfg supervisor.Config, insecure bool, log *slog.Logger) ([]byte, error) {
	dir := datadir.New(cfg.DataDir)
	p := dir.GossipKeyFile()
	if cfg.GossipKey != nil {
		log.Info("gossip is encrypted with the key of --gossip-key-file")
		return cfg.GossipKey, nil
	}
	_, statErr := os.Stat(p)
	switch {
	case statErr == nil && insecure:
		return nil, fmt.Errorf("--insecure-gossip: %s holds this node's gossip key and the rest of its cluster uses it; drop --insecure-gossip, or remove the file to run unencrypted", p)
	case statErr == nil:
		key, err := readKeyFile(p, p)
		if err != nil {
			return nil, err
		}
		log.Info("gossip is encrypted with the key in the data dir", "path", p)
		return key, nil
	case !errors.Is(statErr, fs.ErrNotExist):
		return nil, fmt.Errorf("--data-dir: gossip key: %w", statErr)
	case insecure:
		log.Warn("GOSSIP IS NOT ENCRYPTED (--insecure-gossip): any process that can send to the gossip port, on this host or another, can make every node of this cluster run a program of its choosing", "bind", fmt.Sprintf("%s:%d", cfg.BindAddr, cfg.BindPort))
		return nil, nil
	}
	joins := cfg.Join
	from := "--join " + strings.Join(joins, ",")
	if len(joins) == 0 {
		id, _, err := dir.ReadIdentity()
		if errors.Is(err, datadir.ErrCorrupt) {
			return nil, fmt.Errorf("--data-dir: %v; move it aside to start as a new node", err)
		} else if err != nil {
			return nil, fmt.Errorf("--data-dir: %w", err)
		}
		joins, from = id.Peers, "node.json remembers peers "+strings.Join(id.Peers, ",")
	}
	if len(joins) > 0 {
		return nil, fmt.Errorf("no gossip key: this node joins a cluster (%s) and needs the cluster's key; copy gossip.key from the data dir of the cluster's first node to %s, or pass --gossip-key-file FILE (--insecure-gossip runs unencrypted: anyone who reaches gossip can run code on every node)", from, p)
	}
	// A new cluster: this node makes its key.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	key, err := writeNewGossipKey(p)
	if err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	log.Warn("no --gossip-key-file and no --join: generated a gossip key for this new cluster; every other node needs this same key",
		"path", p, "hint", "copy "+p+" to the other machines and pass --gossip-key-file FILE there, or put it in their data dir as gossip.key")
	return key, nil
}

// writeNewGossipKey writes a new 32-byte key, base64, to path (0600,
// atomically: a crash leaves no half key behind) and returns it.
func writeNewGossipKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// readKeyFile reads a base64 key of 16, 24 or 32 bytes; its errors start
// with what, the flag or file that named it.
func readKeyFile(path, what string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil && what == path {
		return nil, fmt.Errorf("read gossip key: %w", err)
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if what != path {
		what += " " + path
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: not base64; put the cluster's gossip key there (make one with: head -c32 /dev/urandom | base64)", what)
	}
	if l := len(key); l != 16 && l != 24 && l != 32 {
		return nil, fmt.Errorf("%s: key is %d bytes; want 16, 24 or 32 (make one with: head -c32 /dev/urandom | base64)", what, l)
	}
	return key, nil
}
