package fakeengine

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LoRA adapters, as vLLM and SGLang serve them (see the package doc).
//
// vLLM (vllm/entrypoints/openai/models/serving.py OpenAIServingModels):
// adapters named by --lora-modules are loaded at start, through the same
// load_lora_adapter as the runtime endpoint, and a failure stops the
// server; with VLLM_ALLOW_RUNTIME_LORA_UPDATING the API server also mounts
// POST /v1/load_lora_adapter and /v1/unload_lora_adapter
// (vllm/entrypoints/serve/lora/api_router.py attach_router, which mounts
// nothing without it). A request names the adapter in "model" and is
// answered under that name (OpenAIServingModels.model_name).
//
// SGLang (python/sglang/srt/entrypoints/http_server.py): POST
// /load_lora_adapter and /unload_lora_adapter are always mounted; a
// request names the adapter in "lora_path" or as model "BASE:ADAPTER"
// (serving_base.py _resolve_lora_path, _parse_model_parameter: the first
// colon splits).

// EnvVLLMRuntimeLoRA is vLLM's switch for the runtime LoRA endpoints.
const EnvVLLMRuntimeLoRA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

// MetricLoRAInfo is vLLM's LoRA gauge (vllm/v1/metrics/loggers.py
// PrometheusStatLogger): labels max_lora, running_lora_adapters and
// waiting_lora_adapters (adapter names joined by commas), the value the
// time it was set, in seconds since the epoch.
const MetricLoRAInfo = "vllm:lora_requests_info"

// vllmMaxLoRARanks are the values vLLM's --max-lora-rank accepts
// (vllm/config/lora.py MaxLoRARanks).
var vllmMaxLoRARanks = []int{1, 8, 16, 32, 64, 128, 256, 320, 512}

// LoRAModule is one adapter the engine loads at start: vLLM's
// --lora-modules, SGLang's --lora-paths.
type LoRAModule struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// BaseModelName is the parent /v1/models shows (vLLM's JSON form);
	// empty: the served model.
	BaseModelName string `json:"base_model_name,omitempty"`
}

// ParseLoRAModule reads one value of vLLM's --lora-modules as its
// LoRAParserAction does (vllm/entrypoints/openai/cli_args.py): name=path,
// or a JSON object {"name", "path", "base_model_name"} (an item with a
// comma, or without "=", is read as JSON).
func ParseLoRAModule(item string) (LoRAModule, error) {
	if strings.Contains(item, "=") && !strings.Contains(item, ",") {
		name, path, _ := strings.Cut(item, "=")
		if strings.Contains(path, "=") {
			return LoRAModule{}, fmt.Errorf("invalid LoRA module %q: want name=path", item)
		}
		return LoRAModule{Name: name, Path: path}, nil
	}
	var m LoRAModule
	if err := json.Unmarshal([]byte(item), &m); err != nil {
		return LoRAModule{}, fmt.Errorf("invalid JSON format for --lora-modules: %s", item)
	}
	if m.Name == "" || m.Path == "" {
		return LoRAModule{}, fmt.Errorf("invalid fields for --lora-modules: %s - name and path are required", item)
	}
	return m, nil
}

// parseSGLangLoRAPath reads one value of SGLang's --lora-paths
// (server_args.py LoRAPathAction): name=path, a bare path that names the
// adapter by itself, or JSON {"lora_name", "lora_path", "pinned"}.
func parseSGLangLoRAPath(item string) (LoRAModule, error) {
	if strings.HasPrefix(strings.TrimSpace(item), "{") {
		var m struct {
			Name string `json:"lora_name"`
			Path string `json:"lora_path"`
		}
		if err := json.Unmarshal([]byte(item), &m); err != nil || m.Name == "" || m.Path == "" {
			return LoRAModule{}, fmt.Errorf("invalid --lora-paths item %s: want {\"lora_name\": ..., \"lora_path\": ...}", item)
		}
		return LoRAModule{Name: m.Name, Path: m.Path}, nil
	}
	if name, path, ok := strings.Cut(item, "="); ok {
		return LoRAModule{Name: name, Path: path}, nil
	}
	return LoRAModule{Name: item, Path: item}, nil
}

// loraAdapter is one registered adapter.
type loraAdapter struct {
	name, path, parent string
}

// loraRegistry holds the registered adapters in the order they were
// loaded (vLLM's lora_requests dict, SGLang's LoRARegistry).
type loraRegistry struct {
	mu       sync.Mutex
	adapters []loraAdapter
}

func (r *loraRegistry) get(name string) (loraAdapter, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.adapters {
		if a.name == name {
			return a, true
		}
	}
	return loraAdapter{}, false
}

func (r *loraRegistry) list() []loraAdapter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.adapters)
}

// put adds a, or replaces the adapter of its name in place.
func (r *loraRegistry) put(a loraAdapter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.adapters {
		if r.adapters[i].name == a.name {
			r.adapters[i] = a
			return
		}
	}
	r.adapters = append(r.adapters, a)
}

func (r *loraRegistry) remove(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, a := range r.adapters {
		if a.name == name {
			r.adapters = slices.Delete(r.adapters, i, i+1)
			return true
		}
	}
	return false
}

// pyKeys is Python's repr of an OrderedDict's keys, which SGLang's
// messages print: odict_keys(['a', 'b']).
func (r *loraRegistry) pyKeys() string {
	var names []string
	for _, a := range r.list() {
		names = append(names, "'"+a.name+"'")
	}
	return "odict_keys([" + strings.Join(names, ", ") + "])"
}

// errLoRANotFound and errLoRARank are what loading an adapter's directory
// can fail with.
var (
	errLoRANotFound = errors.New("no adapter found")
	errLoRARank     = errors.New("rank above the maximum")
)

// checkAdapterDir stands for the engine's reading of an adapter: the
// directory must exist (vLLM: LoRAAdapterNotFoundError when
// adapter_config.json cannot be opened; the fake asks only for the
// directory), and a rank "r" in its adapter_config.json above maxRank is
// refused (vllm/lora/peft_helper.py PEFTHelper.validate_legal). It returns
// the rank it read (0 when none).
func checkAdapterDir(path string, maxRank int) (int, error) {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return 0, errLoRANotFound
	}
	b, err := os.ReadFile(filepath.Join(path, "adapter_config.json"))
	if err != nil {
		return 0, nil
	}
	var c struct {
		R int `json:"r"`
	}
	if json.Unmarshal(b, &c) != nil {
		return 0, nil
	}
	if maxRank > 0 && c.R > maxRank {
		return c.R, errLoRARank
	}
	return c.R, nil
}

// loraFailure is an adapter load refused, in vLLM's error shape.
type loraFailure struct {
	status int
	typ    string
	msg    string
}

func (f *loraFailure) Error() string { return f.msg }

// vllmLoad is OpenAIServingModels.load_lora_adapter: the request's checks,
// then the engine's add_lora, whose failures come back wrapped by the
// engine core ("Call to add_lora method failed: ...",
// vllm/v1/engine/core.py) as a 500, except a missing adapter, which
// serving.py turns into LoRAAdapterNotFoundError's 404.
func (s *Server) vllmLoad(name, path, parent string, inplace bool) *loraFailure {
	if name == "" || path == "" {
		return &loraFailure{http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."}
	}
	if _, ok := s.loras.get(name); ok && !inplace {
		return &loraFailure{http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf(
			"The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name)}
	}
	if !s.cfg.EnableLoRA {
		// vllm/v1/worker/lora_model_runner_mixin.py _ensure_lora_enabled.
		return &loraFailure{http.StatusInternalServerError, "InternalServerError",
			"Call to add_lora method failed: LoRA is not enabled. Use --enable-lora to enable LoRA."}
	}
	rank, err := checkAdapterDir(path, s.cfg.MaxLoRARank)
	switch {
	case errors.Is(err, errLoRANotFound):
		// vllm/exceptions.py LoRAAdapterNotFoundError.
		return &loraFailure{http.StatusNotFound, "NotFoundError", fmt.Sprintf("Loading lora %s failed: No adapter found for %s", name, path)}
	case errors.Is(err, errLoRARank):
		return &loraFailure{http.StatusInternalServerError, "InternalServerError", fmt.Sprintf(
			"Call to add_lora method failed: LoRA rank %d is greater than max_lora_rank %d.", rank, s.cfg.MaxLoRARank)}
	}
	if parent == "" {
		parent = s.cfg.Model
	}
	s.loras.put(loraAdapter{name: name, path: path, parent: parent})
	s.logf("Loaded new LoRA adapter: name '%s', path '%s'", name, path)
	return nil
}

// loadStaticLoRAs loads Config.LoRAModules at start, as init_static_loras
// does: the first failure stops the engine. SGLang loads --lora-paths at
// start too, under its own cap.
func (s *Server) loadStaticLoRAs() error {
	for _, m := range s.cfg.LoRAModules {
		if s.cfg.Personality == PersonalitySGLang {
			if msg, ok := s.sglangLoad(m.Name, m.Path); !ok {
				return fmt.Errorf("fake engine: --lora-paths %s=%s: %s", m.Name, m.Path, msg)
			}
			continue
		}
		parent := m.BaseModelName
		if parent != s.cfg.Model {
			// Only a served model's name is kept (is_base_model).
			parent = ""
		}
		if f := s.vllmLoad(m.Name, m.Path, parent, false); f != nil {
			return fmt.Errorf("fake engine: --lora-modules %s=%s: %s", m.Name, m.Path, f.msg)
		}
	}
	return nil
}

// handleLoRA mounts the personality's adapter endpoints.
func (s *Server) handleLoRA() {
	switch s.cfg.Personality {
	case PersonalitySGLang:
		s.mux.HandleFunc("/load_lora_adapter", s.sglangLoadHandler)
		s.mux.HandleFunc("/unload_lora_adapter", s.sglangUnloadHandler)
	case PersonalityLlamaCpp:
	default:
		if s.cfg.RuntimeLoRA {
			s.mux.HandleFunc("/v1/load_lora_adapter", s.vllmLoadHandler)
			s.mux.HandleFunc("/v1/unload_lora_adapter", s.vllmUnloadHandler)
		}
	}
}

// readLoRABody reads an adapter endpoint's JSON body; it answers a wrong
// method or a body that is not JSON itself.
func readLoRABody(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		// FastAPI's answer to a route's other methods.
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return false
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error(), badRequest, "")
		return false
	}
	return true
}

// vllmText answers as vLLM's adapter routes do on success: Response(content=
// str), a plain body without a content type.
func vllmText(w http.ResponseWriter, msg string) {
	w.Header()["Content-Type"] = nil
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, msg)
}

// vllmLoadHandler is POST /v1/load_lora_adapter {"lora_name", "lora_path",
// "load_inplace"}.
func (s *Server) vllmLoadHandler(w http.ResponseWriter, r *http.Request) {
	var req struct {
		LoRAName    string `json:"lora_name"`
		LoRAPath    string `json:"lora_path"`
		LoadInplace bool   `json:"load_inplace"`
	}
	if !readLoRABody(w, r, &req) {
		return
	}
	if f := s.vllmLoad(req.LoRAName, req.LoRAPath, "", req.LoadInplace); f != nil {
		writeError(w, f.status, f.msg, f.typ, "")
		return
	}
	vllmText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoRAName))
}

// vllmUnloadHandler is POST /v1/unload_lora_adapter {"lora_name"}
// (OpenAIServingModels.unload_lora_adapter).
func (s *Server) vllmUnloadHandler(w http.ResponseWriter, r *http.Request) {
	var req struct {
		LoRAName string `json:"lora_name"`
	}
	if !readLoRABody(w, r, &req) {
		return
	}
	switch {
	case req.LoRAName == "":
		writeError(w, http.StatusBadRequest, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", "")
	case !s.loras.remove(req.LoRAName):
		writeError(w, http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName), "NotFoundError", "")
	default:
		s.logf("Removed LoRA adapter: name '%s'", req.LoRAName)
		vllmText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoRAName))
	}
}

// sglangLoad is TokenizerManager.load_lora_adapter: ok, or SGLang's
// error_message.
func (s *Server) sglangLoad(name, path string) (string, bool) {
	if !s.cfg.EnableLoRA {
		return "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", false
	}
	if s.cfg.MaxLoadedLoRAs > 0 && len(s.loras.list()) >= s.cfg.MaxLoadedLoRAs {
		return fmt.Sprintf("Cannot load LoRA adapter %s at path %s. Maximum number of loaded LoRA adapters is %d. "+
			"Please unload some LoRA adapters before loading new ones.", name, path, s.cfg.MaxLoadedLoRAs), false
	}
	if _, ok := s.loras.get(name); ok {
		// LoRARegistry._register_adapter.
		return fmt.Sprintf("LoRA with name %s already exists. Loaded LoRAs: %s", name, s.loras.pyKeys()), false
	}
	rank, err := checkAdapterDir(path, s.cfg.MaxLoRARank)
	switch {
	case errors.Is(err, errLoRANotFound):
		// SGLang reports the loader's own exception here (the fake's
		// wording; SGLang's depends on where the path was looked up).
		return fmt.Sprintf("Failed to load LoRA adapter %s: no adapter found at %s", name, path), false
	case errors.Is(err, errLoRARank):
		// lora_manager.py validate_new_adapter, against the memory pool.
		return fmt.Sprintf("LoRA adapter %s with rank %d is incompatible with the current LoRA memory pool configuration. "+
			"Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` and that the target "+
			"modules are included in `--lora-target-modules`.", name, rank), false
	}
	s.loras.put(loraAdapter{name: name, path: path, parent: s.cfg.Model})
	return "", true
}

// sglangResult is SGLang's LoRAUpdateOutput.
func (s *Server) sglangResult(w http.ResponseWriter, msg string, ok bool) {
	if !ok {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error_message": msg, "loaded_adapters": nil})
		return
	}
	loaded := map[string]string{}
	for _, a := range s.loras.list() {
		loaded[a.name] = a.path
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "error_message": nil, "loaded_adapters": loaded})
}

// sglangLoadHandler is SGLang's POST /load_lora_adapter {"lora_name",
// "lora_path", "pinned"}: 200 or 400, both LoRAUpdateOutput.
func (s *Server) sglangLoadHandler(w http.ResponseWriter, r *http.Request) {
	var req struct {
		LoRAName string `json:"lora_name"`
		LoRAPath string `json:"lora_path"`
	}
	if !readLoRABody(w, r, &req) {
		return
	}
	msg, ok := s.sglangLoad(req.LoRAName, req.LoRAPath)
	s.sglangResult(w, msg, ok)
}

// sglangUnloadHandler is SGLang's POST /unload_lora_adapter {"lora_name"}.
func (s *Server) sglangUnloadHandler(w http.ResponseWriter, r *http.Request) {
	var req struct {
		LoRAName string `json:"lora_name"`
	}
	if !readLoRABody(w, r, &req) {
		return
	}
	switch {
	case !s.cfg.EnableLoRA:
		s.sglangResult(w, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", false)
	case !s.loras.remove(req.LoRAName):
		// LoRARegistry.unregister; the keys are printed after the
		// failed removal, as SGLang's message does.
		s.sglangResult(w, fmt.Sprintf("LoRA with name %s does not exist. Loaded LoRAs: %s", req.LoRAName, s.loras.pyKeys()), false)
	default:
		s.sglangResult(w, "", true)
	}
}

// resolveModel reads a generation request's model (and SGLang's
// lora_path) as the engine does: the adapter to run ("" the base model)
// and the name the answer carries, or the error to answer.
func (s *Server) resolveModel(model, loraPath string) (adapter, answerAs string, fail *loraFailure) {
	if s.cfg.Personality == PersonalitySGLang {
		if model == s.cfg.Model && strings.TrimSpace(loraPath) == "" {
			return "", model, nil // the served name itself, ':' and all (qwen:7b)
		}
		base, fromModel, colon := strings.Cut(model, ":")
		if base != s.cfg.Model {
			return "", "", &loraFailure{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model)}
		}
		adapter = strings.TrimSpace(loraPath)
		if adapter == "" && colon {
			adapter = strings.TrimSpace(fromModel)
		}
		if adapter != "" {
			if _, ok := s.loras.get(adapter); !ok {
				// LoRARegistry.acquire; SGLang answers the ValueError
				// as a 400.
				return "", "", &loraFailure{http.StatusBadRequest, badRequest, fmt.Sprintf(
					"The following requested LoRA adapters are not loaded: %s\nLoaded adapters: %s.", adapter, s.loras.pyKeys())}
			}
		}
		// SGLang's answers carry the request's model as it came.
		return adapter, model, nil
	}
	if model == s.cfg.Model {
		return "", model, nil
	}
	if _, ok := s.loras.get(model); ok {
		return model, model, nil
	}
	return "", "", &loraFailure{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model)}
}

// loraInfo keeps vLLM's vllm:lora_requests_info series. vLLM sets the
// gauge, for the labels of the moment, to the current time on every
// engine step, and never removes a label set once used, so every
// combination seen stays exported with the time it was last current; a
// reader takes the series with the largest value. The fake records at
// every change of its queue or batch (a base-model request's too, as
// every step records), which is when vLLM's labels can change.
type loraInfo struct {
	mu     sync.Mutex
	now    func() time.Time
	max    string
	split  bool
	order  []string // adapters with a request in the engine, first come first
	series map[[2]string]float64
	keys   [][2]string // series in the order first seen
	desc   *prometheus.Desc
}

func newLoRAInfo(maxLoRAs int, split bool, now func() time.Time) *loraInfo {
	return &loraInfo{
		now: now, max: strconv.Itoa(maxLoRAs), split: split, series: map[[2]string]float64{},
		desc: prometheus.NewDesc(MetricLoRAInfo, "Running stats on lora requests.",
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil),
	}
}

// record takes the scheduler's LoRA state (under the scheduler's lock).
// As in vLLM since the counts moved into SchedulerStats
// (vllm/v1/metrics/stats.py LoRARequestStates.update_scheduler_stats),
// both labels list every adapter with a request waiting or running, in
// the order each first had one; with split (vLLM releases before that
// move: update_iteration_stats) running lists only adapters with a
// request running and waiting only those with one waiting.
func (l *loraInfo) record(waiting, running map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order = slices.DeleteFunc(l.order, func(n string) bool { return waiting[n] == 0 && running[n] == 0 })
	for _, m := range []map[string]int{running, waiting} {
		names := make([]string, 0, len(m))
		for n := range m {
			if !slices.Contains(l.order, n) {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		l.order = append(l.order, names...)
	}
	pick := func(m map[string]int) string {
		var out []string
		for _, n := range l.order {
			if !l.split || m[n] > 0 {
				out = append(out, n)
			}
		}
		return strings.Join(out, ",")
	}
	key := [2]string{pick(running), pick(waiting)}
	if _, ok := l.series[key]; !ok {
		l.keys = append(l.keys, key)
	}
	l.series[key] = float64(l.now().UnixNano()) / 1e9
}

// Describe and Collect make loraInfo a prometheus.Collector; it exports no
// series before the first step, as vLLM's gauge has none.
func (l *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

func (l *loraInfo) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.keys {
		ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, l.series[k], l.max, k[0], k[1])
	}
}

// loraDefaults fills and checks the LoRA knobs as the engine's config
// does.
func (cfg *Config) loraDefaults() error {
	if cfg.MaxLoRAs < 0 || cfg.MaxLoRARank < 0 || cfg.MaxCPULoRAs < 0 || cfg.MaxLoadedLoRAs < 0 {
		return errors.New("fake engine: the LoRA limits must not be negative (0 means the default)")
	}
	if cfg.Personality == PersonalitySGLang {
		// server_args.py: max_loras_per_batch defaults to 8; a
		// max_lora_rank left unset is taken from the adapters.
		cfg.MaxLoRAs = cmp.Or(cfg.MaxLoRAs, 8)
		if cfg.MaxLoadedLoRAs > 0 && (cfg.MaxLoadedLoRAs < cfg.MaxLoRAs || cfg.MaxLoadedLoRAs < len(cfg.LoRAModules)) {
			// server_args.py check_lora_server_args.
			return fmt.Errorf("fake engine: max_loaded_loras (%d) should be greater than or equal to max_loras_per_batch (%d) and to the number of --lora-paths (%d)",
				cfg.MaxLoadedLoRAs, cfg.MaxLoRAs, len(cfg.LoRAModules))
		}
		return nil
	}
	// vllm/config/lora.py LoRAConfig: max_loras 1, max_lora_rank 16 (one
	// of MaxLoRARanks), max_cpu_loras at least max_loras.
	cfg.MaxLoRAs = cmp.Or(cfg.MaxLoRAs, 1)
	cfg.MaxLoRARank = cmp.Or(cfg.MaxLoRARank, 16)
	if !slices.Contains(vllmMaxLoRARanks, cfg.MaxLoRARank) {
		return fmt.Errorf("fake engine: --max-lora-rank %d: invalid choice (choose from 1, 8, 16, 32, 64, 128, 256, 320, 512)", cfg.MaxLoRARank)
	}
	if cfg.EnableLoRA && cfg.MaxCPULoRAs != 0 && cfg.MaxCPULoRAs < cfg.MaxLoRAs {
		return fmt.Errorf("fake engine: max_cpu_loras (%d) must be >= max_loras (%d)", cfg.MaxCPULoRAs, cfg.MaxLoRAs)
	}
	return nil
}

// EnvTrue reads a boolean as vllm/envs.py does: "1" or "true", any case.
func EnvTrue(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}
