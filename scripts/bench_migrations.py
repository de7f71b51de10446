"""Read a frontend's Prometheus text on stdin; print its migrations by cause and the quantiles of
zl_frontend_migration_seconds (rendered as a summary)."""
import re
import sys

causes, quantiles, count = {}, {}, 0.0
for line in sys.stdin:
    m = re.match(r'zl_frontend_migrations_total\{cause="([^"]+)"\} (\S+)', line)
    if m:
        causes[m.group(1)] = float(m.group(2))
    m = re.match(r'zl_frontend_migration_seconds\{quantile="([^"]+)"\} (\S+)', line)
    if m:
        quantiles[m.group(1)] = float(m.group(2))
    m = re.match(r"zl_frontend_migration_seconds_count (\S+)", line)
    if m:
        count = float(m.group(1))
print("migrations by cause:", ", ".join(f"{c} {int(n)}" for c, n in sorted(causes.items())) or "none")
if count:
    figures = ", ".join(f"p{float(q) * 100:g} {v * 1e3:.0f} ms" for q, v in sorted(quantiles.items(), key=lambda x: float(x[0])))
    print(f"move latency (failure noticed -> the new worker's first frame), {int(count)} moves: {figures}")
