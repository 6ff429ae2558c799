#!/usr/bin/env bash
# Starts stock SGLang (installed by scripts/install-engines sglang) on this
# CPU-only machine, in the foreground (exec: the server's pid is this one):
#
#   tests/engines/sglang_serve.sh MODEL_DIR PORT [EXTRA SGLANG ARGS...]
#
# MODEL_DIR: a Hugging Face checkpoint with tokenizer files, e.g. one made
# by `stitch engine init-model` (head dimension 32 or more, bf16). The
# server listens on 127.0.0.1:PORT only. Extra arguments go to
# `python -m sglang.launch_server` as they are (e.g. --api-key K,
# --enable-metrics, --served-model-name N, --weight-version V); a flag given
# again there overrides the one below.
#
# SGLang starts a tokenizer manager, a scheduler and a detokenizer process;
# stop it by killing the whole process group (start this script with setsid
# and kill -- -PID), not only PID. Startup takes about a minute here.
#
# The python is ${STITCH_SGLANG_PYTHON:-<engines dir>/sglang/bin/python}.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL_DIR PORT [SGLANG ARGS...]" >&2
  exit 2
fi
model="$1" port="$2"
shift 2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
engines_dir="${STITCH_ENGINES_DIR:-$HOME/.cache/stitch/engines}"
python="${STITCH_SGLANG_PYTHON:-$engines_dir/sglang/bin/python}"
if [ ! -x "$python" ]; then
  echo "$0: no SGLang environment at $python (run scripts/install-engines sglang)" >&2
  exit 1
fi

# SGLang's CPU path (sglang.srt.utils.common.is_cpu) is chosen by this
# variable, not by --device alone.
export SGLANG_USE_CPU_ENGINE=1
# The pure-torch common_ops module for sgl_kernel's loader (see the file).
export PYTHONPATH="$here/sglang_cpu_ops${PYTHONPATH:+:$PYTHONPATH}"
# Nothing to download: the model is local and the machine has no internet.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# --mem-fraction-static 0.05 and --max-total-tokens 16384 keep the KV cache
# small (the defaults would size it from the host's memory); no CUDA graphs
# on a CPU.
exec "$python" -m sglang.launch_server \
  --model-path "$model" \
  --host 127.0.0.1 --port "$port" \
  --device cpu \
  --attention-backend torch_native \
  --mem-fraction-static 0.05 \
  --max-total-tokens 16384 \
  --disable-cuda-graph \
  "$@"
