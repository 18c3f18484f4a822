#!/bin/bash
# deploy/k8s against Kubernetes' schema (check_k8s.py): the manifests pass,
# and copies broken eleven ways fail with each break named, so the check
# is seen to check. usage: test_k8s.sh SOURCE_ROOT MEGAD MEGACTL
set -u
src=$1 megad=$2 megactl=$3
py=/usr/bin/python3
$py "$src/tests/deploy/check_k8s.py" "$src/deploy/k8s" "$megad" "$megactl"
rc=$?
[ $rc -ne 0 ] && exit $rc  # 77: skipped (python3-kubernetes missing)

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp "$src"/deploy/k8s/*.yaml "$T"/
sed -i 's/livenessProbe:  # megad/livenesProbe:  # megad/; s/hostNetwork: true/hostNetwork: "yes"/;
        s/--listen=/--listn=/' "$T/megad.yaml"
sed -i 's/--max-restarts 3/--max-restart 3/' "$T/submit-job.yaml"
sed -i 's/^  serviceName: etcd$/  serviceName: [etcd]/' "$T/etcd.yaml"
sed -i 's/^  containers:$/  initContainers:/' "$T/client.yaml"
out=$($py "$src/tests/deploy/check_k8s.py" "$T" "$megad" "$megactl")
rc=$?
fails=0
want() {
  if ! grep -qF -- "$1" <<<"$out"; then echo "FAIL: the broken copy's check lacks: $1"; fails=1; fi
}
[ $rc -eq 1 ] || { echo "FAIL: the broken copy passed (rc $rc)"; fails=1; }
want "V1Container has no field livenesProbe"
want "hostNetwork: wants true or false, not 'yes'"
want "megad serve has no flag --listn"
want "megactl submit has no flag --max-restart"
want "serviceName: wants a string, not ['etcd']"
want "Invalid value for \`containers\`, must not be \`None\`"

# a second copy, whole but for its ports: probes and clients that miss megad
mkdir "$T/ports"
cp "$src"/deploy/k8s/*.yaml "$T/ports"/
sed -i 's/--metrics-listen=127.0.0.1:9100/--metrics-listen=127.0.0.1:9101/' "$T/ports/megad.yaml"
sed -i 's/value: $(HOST_IP):7070/value: $(HOST_IP):7071/' "$T/ports/submit-job.yaml"
sed -i '/host: 127.0.0.1/d' "$T/ports/megad.yaml"
out=$($py "$src/tests/deploy/check_k8s.py" "$T/ports" "$megad" "$megactl")
[ $? -eq 1 ] || { echo "FAIL: the copy with wrong ports passed"; fails=1; }
want "livenessProbe probes port 9100, but --metrics-listen is 127.0.0.1:9101"
want "readinessProbe: --metrics-listen 127.0.0.1:9101 is loopback, so the probe needs host: 127.0.0.1"
want "MEGA_SERVER \$(HOST_IP):7071: megad listens on port 7070"
# and copies whose peer token leaks to a client, or is missing
mkdir "$T/leak" "$T/nopeer"
cp "$src"/deploy/k8s/*.yaml "$T/leak"/
cp "$src"/deploy/k8s/*.yaml "$T/nopeer"/
sed -i 's/secretName: mega-token$/secretName: mega-peer-token/' "$T/leak/client.yaml"
sed -i '/--peer-token-file=/d' "$T/nopeer/megad.yaml"
out=$($py "$src/tests/deploy/check_k8s.py" "$T/leak" "$megad" "$megactl")
[ $? -eq 1 ] || { echo "FAIL: the copy whose client holds the peer token passed"; fails=1; }
want "container megactl: mounts Secret mega-peer-token, megad's --peer-token-file"
out=$($py "$src/tests/deploy/check_k8s.py" "$T/nopeer" "$megad" "$megactl")
[ $? -eq 1 ] || { echo "FAIL: the copy without a peer token passed"; fails=1; }
want "megad has --token-file but no --peer-token-file"
[ $fails -eq 0 ] && echo "PASS: the broken copy failed as it should"
exit $fails
