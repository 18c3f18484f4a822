# Sourced by the shell tests that run a real megad (set $megad first): a
# scratch directory $work (the working directory; removed at exit, after the
# megad is stopped), fail() counting into $fails, and start_megad.

work=$(mktemp -d)
megad_pid=
cleanup() {
  if [ -n "$megad_pid" ] && kill -0 "$megad_pid" 2>/dev/null; then
    kill -TERM "$megad_pid"
    wait "$megad_pid"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1
unset MEGA_SERVER
fails=0

fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# start_megad ARGS...: megad serve on a free port with state in $work/state
# and ARGS; sets megad_pid and port and exports MEGA_SERVER, or exits 1
# with megad's output.
start_megad() {
  "$megad" serve --listen 127.0.0.1:0 --state-dir "$work/state" "$@" >megad.out 2>megad.log &
  megad_pid=$!
  port=
  for _ in $(seq 300); do
    port=$(grep -o 'listening on [^ ]*:[0-9]*' megad.out megad.log 2>/dev/null | head -1 | sed 's/.*://')
    [ -n "$port" ] && break
    kill -0 "$megad_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "FAIL: megad did not say its port"
    cat megad.out megad.log
    exit 1
  fi
  export MEGA_SERVER=127.0.0.1:$port
}
