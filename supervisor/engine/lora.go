package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// LoRA adapters on a ready engine (placement/lora.go). The deployment's
// adapter list is outside its spec version for engines that register
// adapters at runtime (vLLM, SGLang, the fake), so a new list reaches a
// running engine with the next plan, and its watcher makes the engine's
// registered set equal to it through the engine's own endpoints
// (Profile.LoRALoadPath, LoRAUnloadPath). What the record says is
// registered is what the engine's models list says (entries whose parent
// is the served model), read at every readiness probe, never what llmgw
// asked: a registration that failed, or an engine restarted since, shows
// as missing. A failed registration is reported on the adapter (the
// record's adapter_errors), retried with a backoff that doubles from
// adapterRetryMin to adapterRetryMax, and does not make the engine
// unhealthy: the base model and the other adapters serve on.

// Backoff of a failing registration.
const (
	adapterRetryMin = 5 * time.Second
	adapterRetryMax = 5 * time.Minute
	// adapterCallTimeout bounds one load or unload: vLLM reads the
	// adapter's files (or downloads a hub id) inside the call.
	adapterCallTimeout = 2 * time.Minute
)

// adapterSync is the watcher's memory of registrations (only the watch
// goroutine and the sync it starts touch it, one sync at a time).
type adapterSync struct {
	running bool
	done    chan struct{}
	fails   map[string]int
	retryAt map[string]time.Time
}

// registeredAdapters is what the engine's models list says of adapters:
// name → root (the path it loaded), for entries whose parent is served.
func registeredAdapters(body []byte, served string) map[string]string {
	var models struct {
		Data []struct {
			ID     string `json:"id"`
			Root   string `json:"root"`
			Parent string `json:"parent"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &models) != nil {
		return nil
	}
	out := map[string]string{}
	for _, m := range models.Data {
		if m.Parent != "" && m.Parent == served && m.ID != served {
			out[m.ID] = m.Root
		}
	}
	return out
}

// AdapterPath is where the engine reads adapter source src: the entry of
// that name in the weights dir when there is one (a directory, as vLLM and
// SGLang load; or a file, as llama.cpp's --lora takes a GGUF; resolved,
// and only if it stays inside it), src itself when it is absolute, else
// src as a hub id the engine resolves.
func AdapterPath(weightsDir, src string) string {
	if filepath.IsAbs(src) || weightsDir == "" {
		return src
	}
	p := filepath.Join(weightsDir, filepath.FromSlash(src))
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return src
	}
	root, err := filepath.EvalSymlinks(weightsDir)
	if err != nil || !strings.HasPrefix(real, root+string(filepath.Separator)) {
		return src // a link out of the weights dir is not the weights dir's
	}
	if fi, err := os.Stat(real); err != nil || (!fi.IsDir() && !fi.Mode().IsRegular()) {
		return src
	}
	return p
}

// syncAdapters starts, when none runs, one round that loads the
// deployment's adapters missing from the engine and unloads those it no
// longer lists. It returns at once; the round runs beside the watcher.
func (r *Runner) syncAdapters(ctx context.Context, e *managed, w *watchState) {
	if w.adapters.running {
		select {
		case <-w.adapters.done:
			w.adapters.running = false
		default:
			return
		}
	}
	prof, err := e.profile()
	if err != nil || prof.LoRALoadPath == "" {
		return
	}
	e.mu.Lock()
	spec, port, shard := e.desired.Spec, e.state.Spec.HTTPPort, e.state.ShardID
	registered := e.registered
	e.mu.Unlock()
	if spec.MaxLoras == 0 && len(registered) == 0 {
		return
	}
	now := r.cfg.Clock.Now()
	type call struct {
		path string
		body map[string]string
		name string
		load bool
	}
	var calls []call
	want := map[string]bool{}
	for _, a := range spec.Adapters {
		want[a.Name] = true
		path := AdapterPath(r.cfg.WeightsDir, a.Source)
		root, ok := registered[a.Name]
		switch {
		case ok && (root == path || root == ""):
			continue
		case now.Before(w.adapters.retryAt[a.Name]):
			continue
		case ok: // registered from another source: the spec changed it
			calls = append(calls, call{prof.LoRAUnloadPath, map[string]string{"lora_name": a.Name}, a.Name, false})
		}
		calls = append(calls, call{prof.LoRALoadPath, map[string]string{"lora_name": a.Name, "lora_path": path}, a.Name, true})
	}
	for _, name := range sortedNames(registered) {
		if !want[name] {
			calls = append(calls, call{prof.LoRAUnloadPath, map[string]string{"lora_name": name}, name, false})
		}
	}
	if len(calls) == 0 {
		return
	}
	if w.adapters.fails == nil {
		w.adapters.fails, w.adapters.retryAt = map[string]int{}, map[string]time.Time{}
	}
	w.adapters.running, w.adapters.done = true, make(chan struct{})
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	key := r.probe.key(e.id)
	st := &w.adapters
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(st.done)
		for _, c := range calls {
			err := r.adapterCall(ctx, base+c.path, key, c.body)
			switch {
			case err != nil && c.load:
				st.fails[c.name]++
				backoff := min(adapterRetryMin<<min(st.fails[c.name]-1, 10), adapterRetryMax)
				st.retryAt[c.name] = r.cfg.Clock.Now().Add(backoff)
				e.setAdapterError(c.name, fmt.Sprintf("%v (retry in %s)", err, backoff))
				r.log.Warn("LoRA adapter not registered", "shard", shard, "adapter", c.name, "path", c.body["lora_path"], "err", err, "retry_in", backoff)
			case err != nil:
				r.log.Warn("LoRA adapter not unregistered", "shard", shard, "adapter", c.name, "err", err)
			case c.load:
				delete(st.fails, c.name)
				delete(st.retryAt, c.name)
				e.setAdapterError(c.name, "")
				r.log.Info("LoRA adapter registered", "shard", shard, "adapter", c.name, "path", c.body["lora_path"])
			default:
				r.log.Info("LoRA adapter unregistered", "shard", shard, "adapter", c.name)
			}
		}
	}()
}

// adapterCall POSTs body to url with the engine's key, and says what the
// engine answered when it was not a success.
func (r *Runner) adapterCall(ctx context.Context, url, key string, body map[string]string) error {
	b, _ := json.Marshal(body)
	cctx, cancel := context.WithTimeout(ctx, adapterCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.probe.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %d: %s", req.URL.Path, resp.StatusCode, engineMessage(msg))
	}
	return nil
}

// engineMessage is the message of an engine's error body (vLLM's and
// SGLang's {"error": {"message"}} or {"message"}), else the body.
func engineMessage(body []byte) string {
	var e struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error.Message != "" {
			return e.Error.Message
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(string(body))
}

func sortedNames(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// setRegistered records what the engine's models list says of adapters.
func (e *managed) setRegistered(reg map[string]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if maps.Equal(e.registered, reg) {
		return
	}
	e.registered = reg
	notify(e.changes)
}

// setAdapterError records why adapter name could not be registered ("":
// it was).
func (e *managed) setAdapterError(name, why string) {
	why = Clip(printableOnly(why), 200)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.adapterErrs[name] == why {
		return
	}
	if why == "" {
		delete(e.adapterErrs, name)
	} else {
		if e.adapterErrs == nil {
			e.adapterErrs = map[string]string{}
		}
		e.adapterErrs[name] = why
	}
	notify(e.changes)
}

// adapterRecordLocked is the record's view of e's adapters: registered
// (by the engine's models list; for an engine that takes adapters at
// start, the spec's list once it is ready) and the errors of those the
// spec still asks for.
func (e *managed) adapterRecordLocked() ([]string, []gossip.AdapterError) {
	var names []string
	if prof, err := e.profileLocked(); err == nil && prof.LoRALoadPath == "" && e.desired.Spec.AdaptersAtStart() {
		if e.ready {
			names = e.desired.Spec.AdapterNames()
		}
	} else {
		names = sortedNames(e.registered)
	}
	var errs []gossip.AdapterError
	want := map[string]bool{}
	for _, a := range e.desired.Spec.Adapters {
		want[a.Name] = true
	}
	for _, name := range sortedNames(e.adapterErrs) {
		if want[name] && !slices.Contains(names, name) {
			errs = append(errs, gossip.AdapterError{Name: name, Error: e.adapterErrs[name]})
		}
	}
	if len(names) > placement.MaxAdapters {
		names = names[:placement.MaxAdapters]
	}
	return names, errs
}
