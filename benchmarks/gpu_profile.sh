# Where the GPU time goes: `vkserve profile` of the models furthest from the target.
. benchmarks/gpu_env.sh
export __GL_SHADER_DISK_CACHE=0
for m in ${MODELS:-mobilenet mobilenet_v2 resnet50 vgg16 alexnet}; do
  for p in fp16 fp32; do
    python3 -m vkserve profile tests/data/models/$m.param --device 0 --precision $p --cache-dir /tmp/pc --runs 20 --top 8 2>/dev/null
    python3 -m vkserve profile tests/data/models/$m.param --device 0 --precision $p --cache-dir /tmp/pc --runs 20 --json 2>/dev/null >> "$OUT/profiles.jsonl"
  done
done
