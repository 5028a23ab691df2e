"""Per-job wall times from a Snakemake log (issue 24: where the smoke run's time goes): [date] lines before
'rule X:' and 'Finished jobid: N'. Usage: python docs/notes/issue-24-jobtimes.py <snakemake log> [rows]"""
import re, sys, datetime
start, rule, wild, dur = {}, {}, {}, []
stamp = None; cur = None
for line in open(sys.argv[1]):
    m = re.match(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line)
    if m:
        stamp = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"); continue
    m = re.match(r"(?:local)?rule (\w+):", line)
    if m: cur = m.group(1); continue
    m = re.match(r"\s+jobid: (\d+)", line)
    if m and cur: start[m.group(1)] = stamp; rule[m.group(1)] = cur; continue
    m = re.match(r"\s+wildcards: (.*)", line)
    if m and cur: wild[list(start)[-1]] = m.group(1)[:90]; continue
    m = re.match(r"Finished jobid: (\d+)", line)
    if m and m.group(1) in start:
        j = m.group(1); dur.append(((stamp - start[j]).total_seconds(), rule[j], wild.get(j, "")))
dur.sort(reverse=True)
print(f"{len(dur)} jobs, {sum(d for d, _, _ in dur):.0f} s summed")
for d, r, w in dur[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]:
    print(f"{d:6.0f} s  {r:14s} {w}")
