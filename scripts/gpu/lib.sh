# Shared by the GPU scripts (sourced).

# wait_healthy URL PID LOG: waits up to 120 s for URL to answer while process PID lives; on
# failure prints LOG's tail and returns 1.
wait_healthy() {
  for _ in $(seq 1 600); do
    curl -sf "$1" > /dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.2
  done
  echo "$3: not healthy; log tail:"; tail -20 "$3"; return 1
}
