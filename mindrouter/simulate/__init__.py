"""``mr simulate``: a discrete-event simulator that drives the real scheduler core.

Scenario format (TOML; a contract other tools rely on). Keys marked * are required.

    duration = 3600            * simulated seconds (--duration overrides)
    seed = 1                     same file + same seed = same output (--seed overrides; default 0)
    name = "..."                 shown in the report (default: the file's stem)
    description = "..."

    [groups]                     group name -> scheduler_weight; a group not listed here
    faculty = 3                  falls back to the built-in student 1 / staff 2 /
                                 faculty 3 / admin 10, any other is an error

    [models."llama3.1:8b"]       optional, one table per model, the same on every backend
    size = 4.9                   GB a load reads (default 0)
    vram = 6.5                   GB it holds once loaded (default: its size)
    kind = "chat"                or "embedding": its requests only prefill (completion 0;
                                 completion_tokens and max_tokens are refused for its users)
    family = "llama"             its architecture: an Ollama gives some one slot (mllama, qwen3vl...)
    kv_mb_per_token = 0.131      MB of KV cache per token of context: an Ollama runner then holds
                                 vram + this x its context x its slots (default 0: vram holds all)
    context_length = 131072      the context it was trained for: no runner gets more

    [apps.webui]                 a client app; its users' prompts start with its system prompt
    system_prompt = 1500         tokens, the same for everyone using the app (default 0)

    [[backends]]
    name = "gpu1"              * unique
    models = ["llama3"]        * models it serves
    max_concurrent = 4         * requests it runs at once
    tokens_per_second = 50     * decode rate of ONE request; requests side by side
                                 do not slow each other (unless slowdown says so)
    prefill_tokens_per_second    prompt processing rate (default 10 x tokens_per_second),
                                 so a request takes prompt / prefill + completion / decode
    loaded_models = [...]        resident at the start (default: all of models; with vram, none)
    priority = 0                 admin-set score points
    vram = 24                    GB for models; given, the backend behaves like Ollama
                                 (docs/simulate.md): it loads a model on demand, evicts
                                 idle ones (the first by name, as Ollama) when memory or
                                 max_loaded is short, waits while all are busy, and unloads
                                 one idle for keep_alive; every model it serves needs a size
    load_seconds_per_gb = 0.4    seconds a load takes per GB of size (needs vram)
    max_loaded = 3               models loaded at once (needs vram; Ollama's default, 3)
    keep_alive = 300             seconds an idle model stays loaded (needs vram; default 300)
    parallel = 4                 requests each loaded model serves at once (OLLAMA_NUM_PARALLEL;
                                 an Ollama's embedding models and single-slot families serve 1);
                                 default: 1 on an Ollama (Ollama's), else no limit per model
                                 under max_concurrent
    slowdown = 0                 streams side by side slow each other: a model's batch of n
                                 streams steps 1 + slowdown x (n - 1) times slower than one,
                                 and the models with streams running time-share the GPU
    poll_interval = 0            seconds between the daemon's polls: what is loaded reaches the
                                 core at the next one (default 0: at once)
    engine = "ollama"            how it caches prompts and what it reports: "ollama" (the default
                                 with vram) and "llamacpp" keep each slot's last prompt and answer,
                                 "vllm" prefix blocks of 16 tokens, "openai" (the default without
                                 vram: a server of unknown make) nothing
    sharing = "time-share"       how runners of two models share the GPU: "time-share" (they take
                                 turns) or "concurrent" (every stream in one batch, so two models
                                 make more tokens than one)
    load_start_seconds = 0       seconds a load takes to start its runner (needs vram)
    max_queue = 512              requests waiting for a load before it answers busy (needs vram)
    context_length = 8192        OLLAMA_CONTEXT_LENGTH (needs vram; default: Ollama's by the GPU's
                                 vram, 4k below 23 GB, 32k below 47 GB, else 256k)
    kv_cache_tokens = 200000     a vllm engine's KV cache, in tokens (default: no bound)
    [backends.rates]             per model, one stream's rates alone on the GPU, e.g.
    "llama3.1:8b" = { decode = 80, prefill = 3500 }     (default: tokens_per_second and
                                 prefill_tokens_per_second; a decode alone: prefill 10 x it)

    [[users]]
    name = "prof"              * entries with the same name are ONE user (one account,
                                 one deficit, one weight), each entry a phase of its
                                 workload with its own start/stop, model and sizes
    group = "faculty"            or weight = 3 (weight wins; neither means weight 1);
                                 given on one phase, it holds for all of them
    model = "llama3"           * must be served by some backend
    concurrency = 8              closed loop: keeps 8 requests outstanding,
                                 sending the next when one ends (answered or timed out)
    think_time = 0               seconds between an answer and the next request (closed loop) or
                                 the next turn (a conversation); a number or [min, max]
    rate = 0.5                   or open loop: Poisson arrivals per second (exactly one of the two)
    prompt_tokens = 200          a number, or [min, max] drawn uniformly (default 200)
    completion_tokens = 300      likewise (default 300): what the backend really generates
    max_tokens = 512             sent with each request and caps the completion; without it
                                 the scheduler estimates the completion itself
    start = 0                    seconds; the phase sends from start until stop
    stop = 3600                  (default: the end of the run)
    requests = 10                stop the phase after this many requests (conversations, if it
                                 converses)
    stream = true                false: the client waits for the whole answer (the openai
                                 client's default); the core hears of it only at its end and
                                 charges it its expected answer meanwhile, as the daemon does
    leave_after = 10             the client disconnects after this many completion tokens:
                                 the backend stops there, and it is charged what it received
    json_mode = false            true: asks for JSON mode (every simulated backend supports it);
                                 the core routes it as a class of its own and charges it as
                                 any chat request. A user mixes kinds of requests (chat,
                                 embeddings, JSON mode, streamed or not) with several entries
                                 of one name running side by side
    app = "webui"                its prompts start with the app's system prompt ([apps])
    turns = [2, 8]               conversations of this many turns: each turn resends the history
                                 (system prompt, earlier messages and answers) and adds a message of
                                 prompt_tokens; rate or concurrency start conversations, think_time
                                 passes between an answer and the next turn, and a conversation
                                 begun before stop goes on after it (default 1: single requests)
    keep_alive = 600             sent with each request: its model's keep_alive on an Ollama
                                 (seconds; negative: forever; default: the backend's)
    num_ctx = 8192               sent with each request: the context an Ollama runner must have;
                                 a runner with another one reloads (default: Ollama's automatic)

    [[events]]                   weight changes applied to the live scheduler
    at = 1800                  * seconds
    user = "prof"                either a user: weight = 2 gives it a weight of its own,
    weight = 2                   clear = true drops it (back to its group's, or 1)
    group = "faculty"            or a group: weight = 4 for every member without its own

    [scheduler]                  any SchedulerSettings field, e.g. deprioritize_threshold = 1.0
    shares = "user"              or "group": a group's weight is its share, divided among its
                                 active users by their own weights (a weight given to the
                                 user, else 1); "user": each user weighs its weight
    [scheduler.scores]           any ScoreWeights field, e.g. model_loaded = 100

An unknown key, a wrong type or an impossible value is refused with one
sentence naming the key.

Output (``--json`` prints exactly one object, identical for the same file and
seed). Tokens count *as generated*: a request's prompt tokens when its prefill
ends, its completion tokens continuously at the decode rate, so requests still
running at the end count for what they had produced (``"counting":
"as_generated"``). Fairness is judged in *service units*, the unit the core
charges: prompt tokens at ``prompt_token_cost`` (default 1) plus completion
tokens at ``completion_token_cost`` (default 2); with ``service_unit = "gpu"``
each prompt token at its model's weight as the core has learned it when its
prefill ends (``scheduler/fairness/prices.py``). Targets, windows, the service
gap, its bound and the starvation allowance are in units; token shares are
reported beside them (``share``, ``shares``).

Users compete only inside a *pool*: backends joined by serving a common model
(transitively). Targets, windows, the service gap and Jain's index are kept per
pool, among the users who sent requests there, so two users alone on separate
models are each owed all of their own pool.

Inside a pool, slots are counted as the backends hold them
(``mindrouter.simulate.slots``): a backend without ``parallel`` has one set of
``max_concurrent`` slots that any model it serves can take; one with
``parallel`` (Ollama's ``OLLAMA_NUM_PARALLEL``) gives each model its own
``parallel`` slots (an embedding model 1, as Ollama loads it), which no other
model's request can take. Users whose candidate slots are joined (share a slot
set, transitively) form a *group of contention*: the users of one model on
workstations with per-model slots compete only with each other. Targets split
what each group delivers among its members, and the service gap is measured
only between two people who could take the same slot (their candidate slot
sets meet): competing is not transitive, so two people on models that only
different backends of the pool serve are never compared, even where a third
person's model joins those backends.

- ``users``: ``name``, ``weight`` (the last, after events), ``target_share``,
  ``tokens``, ``share``, ``requests`` (completed), ``wait_p50``/``wait_p95``/
  ``wait_max`` (seconds queued before dispatch, nearest rank),
  ``max_starved_s`` (the longest stretch during which the user had a request
  queued and none of its requests started), ``max_passed_over_s`` (the
  longest part of such a stretch in which the scheduler had passed it over:
  docs/simulate.md, "Starvation and being passed over"), ``longest_request_s`` (the
  longest any of its requests took from dispatch to its last token),
  ``timeouts``, plus ``group``, ``submitted``, ``dispatched``, ``timed_out``
  (the same as ``timeouts``), ``rejected``, ``waited_requests`` (could not
  start on arrival), ``max_slots_skipped`` (the most slot-freeing moments a
  request of this user sat through while the slots went to others; 0 means it
  always got the next freed slot), ``backlogged_seconds``,
  ``deprioritized_seconds`` and ``min_factor``. ``target_share`` is the sum of
  the user's targets in every pool over all service units; it is judged
  against ``service_share``, while ``share`` is its part of the tokens. Beside
  tokens: ``service_units`` and ``service_share`` (its tokens at the scenario's
  ``prompt_token_cost`` and ``completion_token_cost``, or the learned prompt weight
  with ``service_unit = "gpu"``, as generated: what fair share charges) and
  ``gpu_seconds`` and ``gpu_share`` (seconds its requests
  held a backend slot, from dispatch to the last token, as a backend's
  utilization counts them). Also
  ``worst_window`` (its own window farthest from its target among those that
  count: ``start``, ``share`` (tokens), ``unit_share``, ``target``,
  ``deviation`` (|unit_share - target|), ``allowed``; null
  when none counts) and ``starvation_allowed_s`` (3 x ``longest_request_s``
  plus the time its largest request takes at its target share of its pools'
  throughput, both in service units: a request costing more than the others get in 3 x its service
  time must wait its turn) and ``passed_over_allowed_s`` (3 x
  ``longest_request_s``, issue 18's bound, held against
  ``max_passed_over_s``), and ``owed_waits``, ``owed_wait_p50`` and
  ``owed_wait_allowed_s`` (issue 30: the requests it sent with nothing else
  queued while its counter was below every other backlogged user's in its
  pool, the median of their waits, and 3 x the median time its own requests
  took; a person owed more than all who wait is served within a few of its
  own requests' time, which passed-over time misses when no slot frees while
  it waits). The table's ``share`` column is
  ``service_share``; token shares, service units and GPU time are printed on
  a line under it.
- ``pools``: one object per pool: ``backends``, ``models``, ``slots``,
  ``users`` (who sent requests there), ``tokens``, ``units`` (service units),
  ``shares`` (of the tokens), ``unit_shares`` and ``target_shares`` (of the
  units) over the run, ``max_service_gap`` (``_pair``, ``_at``),
  ``max_service_gap_beyond_head_start`` (``_pair``), ``max_dispatch_gap``
  (``_pair``), ``max_request_cost``, ``gap_bound``,
  ``jain_index``, ``worst_window`` and ``windows``: per 60 s, ``start``,
  ``shares`` (tokens), ``unit_shares``, ``targets``, ``error`` (the shortfall,
  target - unit_share, of the person whose shortfall is the largest part of its allowance,
  and ``error_user`` whose), ``allowed`` (that person's), ``allowed_by_user``, ``outlasting`` (requests running in it
  that each take longer than a window), ``since_change`` (seconds from the
  last arrival, departure or weight event to its start) and ``counts``
  (whether ``worst_window`` considers it). A pool's target comes from the
  workload alone, never from the scheduler's counters: while someone's request
  waits in the pool, the service delivered at each moment is owed by weighted
  max-min fairness in service units among the people with work there (queued
  or running). A slot delivers units at the rate of the request that holds it
  (a 30,000-token prompt at 5,000 tokens/s of prefill, 4,842 units per
  slot-second; a chat answer at 50 tokens/s, about 130), so each person takes
  at most one slot per outstanding request, of a slot set that serves its
  model, and gets from each its own *units per slot-second*: what its
  outstanding requests cost at their phases' mean sizes (``max_tokens`` and
  ``leave_after`` included) over the seconds they hold a slot alone on the GPU
  (prompt / prefill + completion / decode, averaged over the slot sets that
  serve the model by their slots). Water-filling raises a common level: each
  person receives weight x level units a second, on weight x level / rate
  slots, until its outstanding requests or the slot sets it can use are full
  (``mindrouter.simulate.maxmin`` with weight / rate as each one's weight in
  slots). Each group of contention is owed what it delivered, split by those
  rates among its members (a slot of the embedding model delivers units far
  faster than one of the 70B, so one pool-wide split would owe the 70B's users
  the embedding slots' speed); with ``shares = "group"`` a group's weight is
  divided among its members with work by their own. While nobody waits,
  everyone is owed what it received. With everyone saturating all run long
  that is weight / total weight; a person with few requests outstanding is
  capped at what those requests deliver (its slots x its rate), not at its
  fraction of the slots.
- ``max_service_gap``: the largest change of ``S_a/w_a - S_b/w_b`` (service
  units over weight, or under group
  shares over the user's part of its group's weight) over an interval
  in which users a and b who could take the same slot were both continuously
  backlogged in one pool, measured from the moment both last became
  backlogged (users of models with separate slots, or on different backends,
  never take each other's slots, so nothing bounds how far apart they drift;
  their shares are judged against their targets instead); exact, since it is
  evaluated at every breakpoint. A weight change changes only the slope of
  ``S/w`` from then on. ``max_service_gap_pair``/``_at`` say where;
  ``gap_bound`` is 2 x ``max_request_cost`` (the largest cost of a request in
  the pool, in service units), divided by the smallest entitlement a backlogged user had when
  that is below 1 (under group shares, a member's part of its group). Under
  saturation that bound holds; under partial load the as-generated gap also
  counts work that was already running when a pair became backlogged, so
  ``max_service_gap_beyond_head_start`` (``_pair``) is the same gap less the
  head start of the side ahead: what its requests already running when both
  became backlogged (started in an earlier batch) still had to deliver, over
  its entitlement. No scheduler that never interrupts a running request can
  take that back; the rest is what its choices since account for, and that
  is what the bound is judged on (``model-switch``: 1,920, 0 beyond the head
  start, against 1,600). ``max_dispatch_gap`` (``_pair``) gives the same
  measure with each request's
  whole cost counted at dispatch: the scheduler's decisions alone (with the
  core charging tokens as they stream, that is no longer what it decides on).
  The top-level figures are the worst pool's.
- ``jain_index``: the lowest over the pools of Jain's index of unit share /
  target_share over the users ever backlogged in the pool (with targets by
  weight, that is weight-normalized throughput).
- ``windows``: ``{"start", "shares", "unit_shares"}`` per 60 s over all pools
  (the last may be partial). ``worst_window`` (per pool, and the worst of them
  at the top) is the window, and the person left short in it, whose shortfall
  is the largest part of its allowance, of the full windows of a pool that
  start ``settle_seconds`` (120) or more after the last arrival, departure
  (a phase's start or stop) or weight event in that pool and hold none of
  them, where someone was backlogged. A person's ``allowed`` shortfall is 5
  points; or the pool's largest request cost over the window's units (a
  request is never split, so one that large moves a window by that much) and,
  while a request that takes longer than a window runs there
  (``outlasting``), one slot's share of the pool plus 2 points, but either of
  these at most half its target (a slot frees within the window, and a
  person owed one gets it then: issue 30); and never less than the largest
  prompt's units over the window's (a prompt is counted whole when read).
  On 2 slots a person owed one slot (50%) may be left 25 points short, not
  the 52-62 that allowed every window to pass.
- ``models``: per model, ``kind``, ``submitted``, ``completed``,
  ``timed_out``, ``rejected``, ``completion_tokens``, ``ttft_p50``/``_p95``
  (seconds from submission to the end of the prefill) and ``e2e_p50``/``_p95``
  (to the last token), nearest rank, waits in the queue and for loads included;
  ``prompt_tokens`` (of its answered requests, as sent) and
  ``prompt_tokens_computed`` (the part its backends prefilled, the rest their
  prompt caches held), ``later_turn_ttft_p50``/``_p95`` (turns after a
  conversation's first; null without conversations). ``prompt_cache``:
  ``sent``, ``computed`` and ``computed_over_sent`` over all models.
- ``throughput``: ``tokens_per_second`` (completion tokens as generated, over
  the run), ``saturated_seconds`` (while some request was queued in the core)
  and ``tokens_per_second_at_saturation``. ``loads``: ``count``, ``seconds``,
  ``per_hour``, ``seconds_per_hour``, ``evictions``, ``expirations``
  (keep_alive). ``lost``: ``requests`` (``timed_out`` + ``rejected``).
- ``offline_bound`` (its formula: docs/simulate.md): ``tokens_per_second``
  with every model placed perfectly and no loads, capped by what the users
  sent; ``tokens_per_second_at_saturation``, the mix they sent while the pool
  was saturated served as fast as possible; ``offered_tokens_per_second``;
  ``backends_at_saturation`` (per backend: ``streams``, ``tokens_per_second``,
  ``models``).
- ``perfect_placement`` (docs/simulate.md, "The offline bound"): the same
  workload simulated again on the same pool with every model resident from
  the start (no VRAM limit on residency, no loads, evictions or keep_alive
  expiries; the same rates, slots, sharing and scheduler): its
  ``tokens_per_second``, ``saturated_seconds`` and
  ``tokens_per_second_at_saturation`` (over its own saturated stretches),
  ``run_over_perfect`` and ``run_over_perfect_at_saturation`` (this run's
  figures over those), ``loads`` (0) and ``second_run`` (false where the pool
  has nothing to load, so this run is its own perfect placement); null from
  ``build`` when it is not given the second run.
- ``backends`` (requests, tokens, utilization, ``full_at``: when every slot
  was first busy, ``loads``, ``load_seconds``, ``evictions``,
  ``expirations``), ``deprioritization`` (seconds per user and, if it was in
  play, the same run without it: ``without.shares``, ``max_share_shift``,
  ``max_service_gap``), ``scenario``, ``seed``, ``duration``, ``shares``,
  ``tokens``, ``events``.
"""

from .engine import simulate
from .loading import example_names, load_example, load_scenario, parse_scenario
from .report import build, run_scenario
from .runs import RequestTrace, Run
from .scenario import BackendSpec, EventSpec, ModelSpec, Scenario, ScenarioError, UserSpec
from .workload import Arrival, arrivals

__all__ = [
    "Arrival",
    "BackendSpec",
    "EventSpec",
    "ModelSpec",
    "RequestTrace",
    "Run",
    "Scenario",
    "ScenarioError",
    "UserSpec",
    "arrivals",
    "build",
    "example_names",
    "load_example",
    "load_scenario",
    "parse_scenario",
    "run_scenario",
    "simulate",
]
