"""Per-job wall times from a Snakemake log (issue 24: where the smoke run's time goes): the [date] line before each
job's 'Job N: <rule>: <what>' message (or, with config key job_details, its 'rule X:' block) and before its
'Finished jobid: N'. Usage: python docs/notes/issue-24-jobtimes.py <snakemake log> [rows]"""
import datetime
import re
import sys

start, what, dur = {}, {}, []
stamp, block = None, None
for line in open(sys.argv[1]):
    if m := re.match(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line):
        stamp = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
    elif m := re.match(r"Job (\d+): (.*)", line):  # the rule's message
        start[m.group(1)], what[m.group(1)] = stamp, m.group(2)[:110]
    elif m := re.match(r"(?:local)?rule (\w+):", line):
        block = m.group(1)
    elif (m := re.match(r"\s+jobid: (\d+)", line)) and block:
        start[m.group(1)], what[m.group(1)] = stamp, block
    elif (m := re.match(r"\s+wildcards: (.*)", line)) and block:
        what[list(start)[-1]] += " " + m.group(1)[:90]
    elif (m := re.match(r"Finished jobid: (\d+)", line)) and m.group(1) in start:
        dur.append(((stamp - start[m.group(1)]).total_seconds(), what[m.group(1)]))
dur.sort(reverse=True)
print(f"{len(dur)} jobs, {sum(d for d, _ in dur):.0f} s summed")
for d, w in dur[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]:
    print(f"{d:6.0f} s  {w}")
