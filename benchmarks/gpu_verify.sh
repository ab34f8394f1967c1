# Every model through `vkserve verify` on the GPU (fp32 and fp16) against ncnn on the CPU.
. benchmarks/gpu_env.sh
for m in tests/data/models/*.param tests/data/models/pnnx/*.param; do
  shape=""
  case "$m" in
    */pnnx/deeplabv3_mbv3.param) shape="--shape in0=3,256,256" ;;  # pnnx fixed its Interp sizes
    */pnnx/*) shape="--shape in0=3,224,224" ;;
  esac
  for p in fp32 fp16; do
    python3 -m vkserve verify "$m" $shape --device 0 --precision $p --cache-dir /tmp/vc --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(d['model'], d['precision'], 'ok' if d['ok'] else 'NOT OK', ' '.join(f\"{o['name']}:cos={o['cosine']:.6f},err={100*o['max_abs_err']/max(o['ref_max_abs'],1e-30):.3f}%\" + (f\",det={o['detections']['matched']}/{o['detections']['reference']}\" if o.get('detections') else '') for o in d['outputs']))"
  done
done
