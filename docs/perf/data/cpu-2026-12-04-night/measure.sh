cd /work/main
M=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== start $(date +%T) load $(cat /proc/loadavg)"; bash /tmp/spin.sh
for b in orig w5; do
  echo "== attention $b $(date +%T)"
  /tmp/kvq_$b bench attention --ctx 32768 --batch 1 --q-heads 32 --kv-heads 8 --dim 128 --threads 2 --k f16 --v f16 --k int4 --v int4 --k kivi:2 --v kivi:2 --k turbo_mse:3 --v turbo_mse:3 --reps 20 --json > /tmp/att-$b.json 2>&1; grep -E "^(k |f16|int4|kivi|turbo|cpu)" /tmp/att-$b.json
done
for r in 1 2; do for b in orig w5; do
  echo "== decode $b round $r $(date +%T)"
  /tmp/kvq_$b bench decode --model $M --depth 0,4096,8192 --k f16 --v f16 --k int4 --v int4 --steps 32 --json /tmp/dec-$b-$r.json 2>&1 | grep -E "^(k/v|f16|int4|cpu)"
done; done
for b in orig w5; do
  echo "== avx2 decode $b $(date +%T)"
  KVQ_ISA=avx2 /tmp/kvq_$b bench decode --model $M --depth 0 --k int4 --v int4 --steps 64 2>&1 | grep -E "^(int4|cpu)"
  KVQ_ISA=avx2 /tmp/kvq_$b bench decode --model $M --depth 0 --k int4 --v int4 --steps 64 2>&1 | grep -E "^(int4)"
done
echo "== end $(date +%T) load $(cat /proc/loadavg)"; bash /tmp/spin.sh
