# First call of a GPU session (see gpu_env.sh): install the numba and llvmlite wheels carried in
# .whl_jit/ into /tmp/site-jit.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site-jit .whl_jit/*.whl && echo "jit wheels installed"
