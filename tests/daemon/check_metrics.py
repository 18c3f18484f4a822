"""The /metrics page through Prometheus' own parser (python3-prometheus-client):
every family parses with its declared type, counters are counters, and the
values come back; then through `promtool check metrics` (Debian's prometheus),
Prometheus' own lint of names, units and help. Usage: check_metrics.py
TEST_METRICS_TEXT (run with --print). Exit 77 (skipped) without
prometheus_client."""
import shutil
import subprocess
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("python3-prometheus-client is not installed: skipped (scripts/install-deps)")
    sys.exit(77)

page = subprocess.run([sys.argv[1], "--print"], check=True, capture_output=True,
                      text=True).stdout
families = {f.name: f for f in text_string_to_metric_families(page)}

# the client strips _total from a counter family's name
for name in ["mega_jobs_submitted", "mega_jobs_finished", "mega_job_restarts",
             "mega_job_events", "mega_steps_merged", "mega_worker_steps_relayed",
             "mega_watchers_dropped", "mega_rpc_served", "mega_http_requests",
             "process_cpu_seconds"]:
    assert families[name].type == "counter", name
for name in ["mega_jobs", "mega_node_slots", "mega_job_iteration", "mega_job_loss",
             "process_resident_memory_bytes", "process_open_fds"]:
    assert families[name].type == "gauge", name
assert families["mega_step_report_delay_seconds"].type == "summary"


def value(family, **labels):
    for s in families[family].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"{family} {labels} missing")


assert value("mega_jobs_submitted") == 4
assert value("mega_jobs_finished", state="succeeded") == 1
assert value("mega_rpc_served", method="/mega.v1.Control/GetJob") == 9
assert value("mega_job_iteration", job="j-1-a") == 7
# the escaped id comes back as it was
assert value("mega_job_iteration", job='j-4-"x\\y\nz') == 7
assert value("process_resident_memory_bytes") == 4194304
for f in families.values():
    for s in f.samples:
        assert "name" not in s.labels, s
print(f"{len(families)} families parsed")

promtool = shutil.which("promtool")
if promtool:
    lint = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True,
                          text=True)
    assert lint.returncode == 0, f"promtool check metrics:\n{lint.stdout}{lint.stderr}"
    print("promtool check metrics: no problems")
else:
    print("promtool is not installed (Debian's prometheus; scripts/install-deps): lint not run")
