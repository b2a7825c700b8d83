#!/usr/bin/env python3
"""Turn the per-run lines outbox-bench prints (stderr) into the `pairs` of its results.json, keeping pairs whose runs all finished.

Usage: log2json.py LOG RUNS EVENTS SQS_EVENTS ARTICLE_EVENTS > pairs.json
Used once for docs/bench/first-invocation.json, whose `setup` block was written beside it."""
import json, re, sys, subprocess
log = open(sys.argv[1]).read().splitlines()
runs = int(sys.argv[2]); events = int(sys.argv[3]); sqs_events = int(sys.argv[4]); article_events = int(sys.argv[5])
pairs = []
cur = None
def fig(p, name, unit):
    for f in p['figures']:
        if f['name'] == name: return f
    f = {'name': name, 'unit': unit, 'values': []}; p['figures'].append(f); return f
for line in log:
    m = re.match(r'== (\S+) → (\S+)', line)
    if m:
        ev = sqs_events if m.group(2) == 'sqs' else events
        cur = {'store': m.group(1), 'sink': m.group(2), 'events': ev, 'article_events': min(article_events, ev), 'figures': []}
        pairs.append(cur); continue
    if cur is None: continue
    l = line.strip()
    m = re.match(r'drain with (\d+) relay\(s\): ([\d.]+) events/s, peak RSS ([\d.]+) MiB', l)
    if m:
        n = int(m.group(1))
        fig(cur, f"drain, {n} relay{'' if n == 1 else 's'}", 'events/s')['values'].append(float(m.group(2)))
        if n == 1: cur.setdefault('_rss', []).append(float(m.group(3)))
        continue
    m = re.match(r'article: ([\d.]+) events/s', l)
    if m: fig(cur, "article's algorithm", 'events/s')['values'].append(float(m.group(1))); continue
    m = re.match(r'database ceiling: ([\d.]+) rows/s', l)
    if m: fig(cur, 'database ceiling (claim + mark, no broker)', 'rows/s')['values'].append(float(m.group(1))); continue
    m = re.match(r'broker ceiling: ([\d.]+) events/s', l)
    if m: fig(cur, 'broker ceiling (same client, no database)', 'events/s')['values'].append(float(m.group(1))); continue
    m = re.match(r'latency at (\d+)/s: p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms \((\d+) events, ([\d.]+) commits/s\)', l)
    if m:
        r = m.group(1)
        fig(cur, f'commit→receive p50 at {r}/s', 'ms')['values'].append(float(m.group(2)))
        fig(cur, f'commit→receive p99 at {r}/s', 'ms')['values'].append(float(m.group(3)))
        fig(cur, f'commit→receive max at {r}/s', 'ms')['values'].append(float(m.group(4)))
        fig(cur, f'writes achieved at {r}/s', 'commits/s')['values'].append(float(m.group(6)))
        continue
    m = re.match(r'writers: ([\d.]+) commits/s alone, ([\d.]+) with the relay running', l)
    if m:
        fig(cur, 'writers, relay stopped', 'commits/s')['values'].append(float(m.group(1)))
        fig(cur, 'writers, relay running', 'commits/s')['values'].append(float(m.group(2)))
        continue
done = []
for p in pairs:
    rss = p.pop('_rss', [])
    p['figures'].append({'name': 'relay peak RSS (1 relay, drain)', 'unit': 'MiB', 'values': rss})
    if all(len(f['values']) == runs for f in p['figures']):
        done.append(p)
    else:
        print(f"skipping {p['store']} → {p['sink']}: incomplete", file=sys.stderr)
# put the figures in the bench's order
order = lambda f: (0 if f['name'].startswith('drain') else 1 if f['name'].startswith('article') else 2 if f['name'].startswith('database') else 3 if f['name'].startswith('broker') else 4 if 'at ' in f['name'] else 5 if f['name'].startswith('writers') else 6)
for p in done:
    p['figures'].sort(key=order)
json.dump(done, sys.stdout, indent=2, ensure_ascii=False)
