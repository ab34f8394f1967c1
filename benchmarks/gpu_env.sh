# Sourced at the start of a run on the GPU machine (the `device` tool): unpack the Vulkan
# loader (libvulkan1 and the libglvnd packages NVIDIA's ICD needs: libglvnd0 libegl1 libgl1
# libglx0 libopengl0 libgles2) carried in .gl/ and the Python 3.12 wheels carried in .whl/.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# numba + llvmlite (the CPU kernels' JIT): the machine's own (numba 0.68 on 2026-11-30; a
# carried llvmlite older than its numba wants breaks the import). Carry them only for another
# version, in a call of their own (llvmlite's wheel is most of the 64 MiB carry).
export PYTHONPATH=/tmp/site:$PWD VKSERVE_GLSLANG_LIBDIR=/tmp/site/cmeel.prefix/lib PYTHONUNBUFFERED=1
if ! python3 -c 'import vulkan' 2>/dev/null || ! python3 -m vkserve devices --json | grep -q '"vulkan"'; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
