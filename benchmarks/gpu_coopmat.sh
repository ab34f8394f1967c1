# Issue 17 on the GPU machine: the tensor-core convolutions and products (conv_coopmat.comp,
# gemm_coopmat.comp) checked against ncnn layer by layer and model by model, then timed per
# layer against the FMA shaders and whole models against PyTorch (cuDNN, CUDA graph).
# Each step has its own time limit; the log is in $OUT/coopmat.log. Arguments go to
# vulkan_vs_torch.py (e.g. --only vgg16 pnnx/convnext_tiny).
. benchmarks/gpu_env.sh
exec > >(tee "$OUT/coopmat.log") 2>&1
python3 -m vkserve devices --json | python3 -c "import json,sys; [print(d.get('name'), 'coopmat shapes:', d.get('cooperative_matrix_shapes')) for d in json.load(sys.stdin)]"
timeout 90 python3 -m pytest -q -x -p no:cacheprovider benchmarks/gpu_tests/test_coopmat.py -k "offers or 1x1-tails" 2>&1 | tail -15
timeout 150 python3 -m pytest -q -p no:cacheprovider benchmarks/gpu_tests/test_gemm_coopmat.py 2>&1 | tail -15
for m in "resnet50.param" "pnnx/convnext_tiny.param --shape in0=3,224,224" "pnnx/vit_tiny.param --shape in0=3,224,224"; do
  timeout 60 python3 -m vkserve verify tests/data/models/$m --device 0 --precision fp16 --cache-dir /tmp/vc --json 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(d['model'], d['precision'], 'ok' if d['ok'] else 'NOT OK', [(o['name'], round(o['cosine'], 6)) for o in d['outputs']])"
done
timeout 120 python3 benchmarks/coopmat_layers.py --only pnnx/convnext_tiny pnnx/vit_tiny --runs 10 \
  --json "$OUT/coopmat_layers.json" | grep "^|"
timeout 400 python3 benchmarks/vulkan_vs_torch.py --repeat 50 --nocoop --json "$OUT/vulkan_vs_torch.json" "$@"
