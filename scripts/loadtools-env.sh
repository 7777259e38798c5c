#!/usr/bin/env bash
# Create (idempotently) one virtualenv per load-test tool for slokit's loadtools-marked tests.
#
#   scripts/loadtools-env.sh [REPO_ROOT]        default: the repository this script is in
#
# Makes <root>/.venv-aiperf (aiperf==0.13.0) and <root>/.venv-guidellm (guidellm==0.8.1), each
# tool alone in its venv (their pins clash with each other and with slokit's). Both bring
# transformers and tokenizers, which the tests use to build a local tokenizer (no hub
# download). kubernetes-sigs/inference-perf is not on PyPI: its importer is tested on a file
# built from its source schema (tests/fixtures/loadtools/README.md).
# A stamp file in each venv records what was installed; a second run with the same stamp is a
# no-op for that venv.
#
# Environment:
#   SLOKIT_LOADTOOLS               tools to build, e.g. "aiperf" (default: "aiperf guidellm")
#   SLOKIT_LOADTOOLS_BASE_PYTHON   interpreter that creates the venvs (default: python3.11, then python3)
set -euo pipefail

# GuideLLM requires torch (any version): the CPU build vllm-env installs too (pip's
# configuration serves it) keeps its venv at about a fifth of the CUDA build's 6 GB.
ALL_TOOLS=("aiperf:aiperf==0.13.0" "guidellm:guidellm==0.8.1 torch==2.13.0+cpu")
# SLOKIT_LOADTOOLS: which of them to build (default all); `make test` builds the ones its
# tests run (both: tests/loadtools/test_aiperf_real.py and test_guidellm_real.py).
TOOLS=()
for entry in "${ALL_TOOLS[@]}"; do
    for want in ${SLOKIT_LOADTOOLS:-aiperf guidellm}; do
        [[ "${entry%%:*}" == "${want}" ]] && TOOLS+=("${entry}")
    done
done
STAMP_VERSION="slokit-loadtools-env v1"

repo_root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

die() {
    echo "loadtools-env: ERROR: $*" >&2
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

base_python="${SLOKIT_LOADTOOLS_BASE_PYTHON:-}"
if [[ -z "${base_python}" ]]; then
    for candidate in python3.11 python3; do
        if command -v "${candidate}" >/dev/null 2>&1; then
            base_python="${candidate}"
            break
        fi
    done
fi
[[ -n "${base_python}" ]] || die "no python3.11 or python3 on PATH (set SLOKIT_LOADTOOLS_BASE_PYTHON)"

for entry in "${TOOLS[@]}"; do
    tool="${entry%%:*}"
    spec="${entry#*:}"
    venv="${repo_root}/.venv-${tool}"
    stamp="${venv}/.slokit-loadtools-env"
    want="${STAMP_VERSION}: ${spec}"
    t_start="$(now)"
    if [[ -x "${venv}/bin/python" && -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
        echo "loadtools-env: ${venv} is up to date (${spec}); nothing to do ($(since "${t_start}") s)"
        continue
    fi
    rm -f "${stamp}"
    if [[ ! -x "${venv}/bin/python" ]]; then
        "${base_python}" -m venv "${venv}" \
            || die "python -m venv ${venv} failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    py="${venv}/bin/python"
    read -ra pkgs <<<"${spec}"
    "${py}" -m pip install -qq --disable-pip-version-check "${pkgs[@]}" \
        || die "pip install ${spec} into ${venv} failed (see above)"
    versions="$("${py}" -c "
import importlib.metadata as m, tokenizers, transformers
print('${tool}', m.version('${tool}'), 'transformers', transformers.__version__)
" 2>&1)" || die "${venv} cannot import ${tool}/transformers/tokenizers:
${versions}"
    printf '%s' "${want}" >"${stamp}"
    echo "loadtools-env: ${venv} ready: ${versions##*$'\n'} ($(since "${t_start}") s)"
done
