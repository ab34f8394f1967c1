#!/usr/bin/env bash
# Set up (when missing) and run vkserve from this checkout on Debian, as root:
#   deploy/dev.sh serve [args]   the main job: the daemon with the embedded default config
#   deploy/dev.sh test  [args]   the whole test suite (pytest arguments pass through)
# Installs Debian's Vulkan loader and Mesa's lavapipe (software Vulkan), a .venv and
# the package with its test extras; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_missing=()
# vulkan-validationlayers (4.5 MB): VKSERVE_VALIDATION=1 and its tests (NCNN_LOGE, debug printf)
for pkg in libvulkan1 mesa-vulkan-drivers vulkan-validationlayers python3-venv systemd; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt_missing+=("$pkg")
done
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${apt_missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >&2
fi

stamp=.venv/.vkserve-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing vkserve into .venv" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e '.[test]' >&2
  # pnnx for `vkserve import` and its tests: its executable converts ONNX without torch
  .venv/bin/python -m pip install -q --no-deps pnnx >&2
  echo "$want" >"$stamp"
fi

cmd=${1:-serve}
shift || true
case "$cmd" in
  serve) exec .venv/bin/vkserve serve "$@" ;;
  # two workers, each test file on one (its module fixtures and daemons stay together); the
  # CPU kernels are compiled once before they start (tests/conftest.py). `-n 0`: one process.
  test) exec .venv/bin/python -m pytest -n "${VKSERVE_TEST_WORKERS:-2}" --dist loadfile "$@" ;;
  *) echo "usage: $0 serve|test [args]" >&2; exit 2 ;;
esac
