#!/usr/bin/python3
"""deploy/k8s's manifests against Kubernetes' own API schema, without a cluster.

The schema is Debian's python3-kubernetes (the Kubernetes Python client,
22.6: the 1.22 API), whose model classes list every field of every object
with its JSON name and type. Each document must:
  - parse (python3-yaml) and name an apiVersion and kind the client models;
  - use only fields that exist there, each of the right type (a string where
    a string goes: `"true"`, not `true`), recursively;
  - have its required fields (the client's own deserializer refuses it
    otherwise);
and hold together: a workload's selector matches its template's labels,
every volumeMount names a volume, every probe's named port is a container
port, and megad's --listen and --metrics-listen are the ports its container
declares, its probes reach (port and host) and its clients' MEGA_SERVER
names, every Secret and PersistentVolumeClaim it uses is one the README says
the user makes, every $(VAR) in args and env is defined before, and every
flag given to megad or megactl is one that program's --help lists (the
built programs are run for that), and megad's peer token (--peer-token-file,
which a megad with --token-file must have, or clients could act as nodes)
comes from a Secret that no other workload mounts.

What this does not do: talk to a real API server (admission, defaults,
quotas), pull the images, or run anything on a GPU node.

usage: check_k8s.py DIR MEGAD MEGACTL   (exit 77: python3-kubernetes missing)
"""
import glob
import os
import re
import subprocess
import sys

try:
    import yaml
    import kubernetes.client as kc
    from kubernetes.client import ApiClient
except ImportError as e:
    print("skipped: %s (Debian: python3-yaml, python3-kubernetes)" % e)
    sys.exit(77)

# Made by the user, as deploy/k8s/README.md says how.
USER_SECRETS = {"mega-token", "mega-peer-token", "mega-tls"}
USER_CLAIMS = {"mega-shared"}

errors = []


def err(where, msg):
    errors.append("%s: %s" % (where, msg))


def model_for(api_version, kind):
    version = api_version.split("/")[-1]  # v1, apps/v1, batch/v1
    name = version[0].upper() + version[1:] + kind
    return getattr(kc, name, None), name


def check_value(where, value, typ):
    """value (from YAML) against an openapi type string of the client."""
    if typ in ("object",):
        return  # IntOrString, quantities, free-form: anything scalar or map
    if typ == "str":
        if not isinstance(value, str):
            err(where, "wants a string, not %r (%s): quote it" % (value, type(value).__name__))
        return
    if typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            err(where, "wants an integer, not %r" % (value,))
        return
    if typ == "bool":
        if not isinstance(value, bool):
            err(where, "wants true or false, not %r" % (value,))
        return
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            err(where, "wants a number, not %r" % (value,))
        return
    if typ == "datetime":
        return
    m = re.fullmatch(r"list\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            err(where, "wants a list, not %r" % (value,))
            return
        for i, v in enumerate(value):
            check_value("%s[%d]" % (where, i), v, m.group(1))
        return
    m = re.fullmatch(r"dict\((\w+), (.+)\)", typ)
    if m:
        if not isinstance(value, dict):
            err(where, "wants a map, not %r" % (value,))
            return
        for k, v in value.items():
            check_value("%s.%s" % (where, k), v, m.group(2))
        return
    cls = getattr(kc, typ, None)
    if cls is None:
        err(where, "the schema names an unknown type %s" % typ)
        return
    check_object(where, value, cls)


def check_object(where, value, cls):
    if not isinstance(value, dict):
        err(where, "wants an object (%s), not %r" % (cls.__name__, value))
        return
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            err("%s.%s" % (where, key), "%s has no field %s" % (cls.__name__, key))
            continue
        check_value("%s.%s" % (where, key), v, cls.openapi_types[by_json[key]])


def program_flags(prog, *args):
    out = subprocess.run([prog, *args, "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


# (where, MEGA_SERVER) of every client container, checked against megad's port
CLIENT_SERVERS = []
MEGAD_PORTS = []
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def host_port(value):
    host, _, port = value.rpartition(":")
    return host, int(port) if port.isdigit() else None


def check_listeners(cw, pod_spec, c, args):
    """megad's --listen and --metrics-listen against the container's ports and
    probes: a probe must reach the port megad serves /healthz on, at an address
    it listens on (the kubelet probes the pod's IP unless httpGet.host says
    otherwise; a loopback listener needs host 127.0.0.1 and host networking)."""
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    numbers = set(ports.values())
    listen = opts.get("--listen")
    if listen:
        _, port = host_port(listen)
        MEGAD_PORTS.append(port)
        if port not in numbers:
            err(cw, "--listen %s: port %s is not a containerPort" % (listen, port))
    metrics = opts.get("--metrics-listen")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = (c.get(probe) or {}).get("httpGet")
        if not get:
            continue
        if not metrics:
            err(cw, "%s asks HTTP, but megad has no --metrics-listen to answer it" % probe)
            continue
        mhost, mport = host_port(metrics)
        pport = ports.get(get["port"]) if isinstance(get["port"], str) else get["port"]
        if pport != mport:
            err(cw, "%s probes port %s, but --metrics-listen is %s" % (probe, pport, metrics))
        phost = get.get("host")
        if mhost in LOOPBACK:
            if phost not in LOOPBACK or not pod_spec.get("hostNetwork"):
                err(cw, "%s: --metrics-listen %s is loopback, so the probe needs host: "
                        "127.0.0.1 and hostNetwork (the kubelet probes the pod's IP)"
                    % (probe, metrics))
        elif phost and phost not in (mhost, "$(POD_IP)"):
            err(cw, "%s probes host %s, but --metrics-listen is %s" % (probe, phost, metrics))


# (where, Secret name) of every Secret a workload other than megad mounts,
# and the Secrets megad's --peer-token-file reads: those two must not meet.
OTHER_SECRETS = []
PEER_SECRETS = set()


def secret_of(c, volumes, path):
    """The Secret a file path of container c comes from (None: not one)."""
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/") + "/"
        v = volumes.get(m["name"], {})
        if path.startswith(mp) and "secret" in v:
            return v["secret"]["secretName"]
    return None


def check_peer_token(cw, c, volumes, args):
    """megad with --token-file has --peer-token-file, from a Secret of its own."""
    opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    if "--token-file" in opts and "--peer-token-file" not in opts:
        err(cw, "megad has --token-file but no --peer-token-file: whoever holds the cluster "
                "token could act as a node")
    ptok = opts.get("--peer-token-file")
    if ptok:
        sec = secret_of(c, volumes, ptok)
        if sec is None:
            err(cw, "--peer-token-file %s is not in a mounted Secret" % ptok)
        elif sec == secret_of(c, volumes, opts.get("--token-file", "")):
            err(cw, "--peer-token-file and --token-file come from one Secret, %s" % sec)
        else:
            PEER_SECRETS.add(sec)


def check_workload(where, pod_spec, selector_labels, template_labels, flags):
    if selector_labels is not None:
        for k, v in selector_labels.items():
            if template_labels.get(k) != v:
                err(where, "selector %s=%s does not match the template's labels" % (k, v))
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for v in volumes.values():
        if "secret" in v and v["secret"]["secretName"] not in USER_SECRETS:
            err(where, "Secret %s is not one the README has you make" % v["secret"]["secretName"])
        pvc = v.get("persistentVolumeClaim")
        if pvc and pvc["claimName"] not in USER_CLAIMS:
            err(where, "claim %s is not one the README has you make" % pvc["claimName"])
    for c in pod_spec.get("containers", []):
        cw = "%s container %s" % (where, c["name"])
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes and m["name"] not in ("data",):  # data: a claim template
                err(cw, "mounts volume %s, which the pod does not have" % m["name"])
        ports = {p.get("name") for p in c.get("ports", [])}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            p = c.get(probe)
            if not p:
                continue
            port = (p.get("httpGet") or p.get("tcpSocket") or {}).get("port")
            if isinstance(port, str) and port not in ports:
                err(cw, "%s names port %s, which the container does not have" % (probe, port))
        defined = set()
        for e in c.get("env", []):
            for ref in re.findall(r"\$\((\w+)\)", e.get("value", "") or ""):
                if ref not in defined:
                    err(cw, "env %s uses $(%s) before it is defined" % (e["name"], ref))
            defined.add(e["name"])
        for a in c.get("args", []) + c.get("command", []):
            for ref in re.findall(r"\$\((\w+)\)", a):
                if ref not in defined:
                    err(cw, "uses $(%s), which its env does not define" % ref)
        cmd = c.get("command", [])
        args = c.get("args", [])
        if cmd and cmd[0] == "megad" and args and args[0] == "serve":
            for a in args[1:]:
                flag = a.split("=", 1)[0]
                if flag not in flags["megad"]:
                    err(cw, "megad serve has no flag %s" % flag)
            check_listeners(cw, pod_spec, c, args[1:])
            check_peer_token(cw, c, volumes, args[1:])
        else:
            for m in c.get("volumeMounts", []):
                v = volumes.get(m["name"], {})
                if "secret" in v:
                    OTHER_SECRETS.append((cw, v["secret"]["secretName"]))
        for e in c.get("env", []):
            if e.get("name") == "MEGA_SERVER" and e.get("value"):
                CLIENT_SERVERS.append((cw, e["value"]))
        for a in args:  # megactl in shell scripts
            for line in re.findall(r"megactl (\w[\w-]*)([^\n|]*(?:\\\n[^\n|]*)*)", a):
                sub, rest = line
                for flag in re.findall(r"(--[a-z][a-z0-9-]*)", rest):
                    if flag not in flags["megactl " + sub]:
                        err(cw, "megactl %s has no flag %s" % (sub, flag))


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    d, megad, megactl = sys.argv[1:]
    flags = {"megad": program_flags(megad)}
    for sub in ("submit", "watch"):
        flags["megactl " + sub] = program_flags(megactl, sub)
    api = ApiClient()
    ndocs = 0
    files = sorted(glob.glob(os.path.join(d, "*.yaml")))
    if not files:
        err(d, "no manifests")
    for f in files:
        try:
            docs = [x for x in yaml.safe_load_all(open(f)) if x is not None]
        except yaml.YAMLError as e:
            err(f, "does not parse: %s" % e)
            continue
        for i, doc in enumerate(docs):
            where = "%s[%d]" % (os.path.basename(f), i)
            cls, name = model_for(doc.get("apiVersion", ""), doc.get("kind", ""))
            if cls is None:
                err(where, "no %s in the Kubernetes API (%s %s)" % (name, doc.get("apiVersion"),
                                                                    doc.get("kind")))
                continue
            where = "%s %s" % (where, doc["kind"])
            ndocs += 1
            before = len(errors)
            check_object(where, doc, cls)
            if len(errors) == before:  # required fields, by the client's own rules
                try:
                    api._ApiClient__deserialize(doc, name)
                except (ValueError, TypeError) as e:
                    err(where, str(e))
            spec = doc.get("spec", {})
            if doc["kind"] in ("DaemonSet", "StatefulSet", "Deployment", "Job"):
                t = spec.get("template", {})
                sel = spec.get("selector", {}).get("matchLabels")
                check_workload(where, t.get("spec", {}), sel,
                               t.get("metadata", {}).get("labels", {}), flags)
            elif doc["kind"] == "Pod":
                check_workload(where, spec, None, {}, flags)
    for cw, server in CLIENT_SERVERS:  # megactl's MEGA_SERVER is megad's port
        _, port = host_port(server)
        if MEGAD_PORTS and port not in MEGAD_PORTS:
            err(cw, "MEGA_SERVER %s: megad listens on port %s" % (server, MEGAD_PORTS[0]))
    for cw, sec in OTHER_SECRETS:  # the peer token stays with the megads
        if sec in PEER_SECRETS:
            err(cw, "mounts Secret %s, megad's --peer-token-file: a client that holds it can "
                    "act as a node; give clients the cluster token only" % sec)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print("%d documents in %d files: fields and types as Kubernetes %s's schema has them, "
          "references whole, megad and megactl flags real" % (ndocs, len(files),
                                                             "1.22 (python3-kubernetes)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
