# Issue 2/3 proof on the GPU machine: devices, the extension-mode test, cache warm cold/warm.
. benchmarks/gpu_env.sh
python3 -m vkserve devices
python3 -m vkserve devices --json > "$OUT/devices.json"
python3 -m pytest -q -p no:cacheprovider tests/test_glsl_modes.py tests/test_glsl_compiler.py \
  tests/test_devices.py -k "not lavapipe and not no_vulkan" -rA 2>&1 | tee "$OUT/tests.log" | tail -45
rm -rf /tmp/cw
for i in 1 2; do python3 -m vkserve cache warm --cache-dir /tmp/cw --json; done 2>&1 | tee "$OUT/warm.log"
