// A cache-aware router's view of prefixd, from its KV events alone: a second implementation
// of the stream (npm `zeromq` 6 and `@msgpack/msgpack`, not the server's libraries) reads
// the real binary's --kv-events (live, with --kv-events-replay to fill gaps), rebuilds the
// set of blocks each replica holds, and predicts for a new prompt how many prompt tokens the
// server will report cached. The prediction must hold up to the partial block prefixd copies
// at token granularity: predicted <= cached < predicted + block_size. Checked after a
// workload that overflows the pool (evictions), with two tenants sending the same prompt,
// with a LoRA adapter, with the disk tier on (a spill is a removal from the pool, then a store
// on DISK once its file is written), after a restart over the same cache dir (the files found
// are stored on DISK at start-up, without identity) and while the disk tier's cap deletes
// files (removals from DISK). `prefixctl events` prints the same stream.
//
//   node kv_events_router_test.mjs --build BUILD --tokenizer DIR --deps DIR
//
// --deps is the npm prefix holding zeromq@6 and @msgpack/msgpack (scripts/setup installs
// them into .deps/kv-events-sub). Without them, or without the built binaries, the test exits
// 77 (ctest: skipped) saying what is missing. No timing is asserted: every wait is for a
// condition, with a generous bound.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

const SKIP = 77;
const WAIT_MS = 120_000;  // generous: 2 busy cores

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i];
    if (!name.startsWith('--') || i + 1 >= argv.length) {
      console.error(`kv_events_router_test: bad argument '${name}' (--build --tokenizer --deps)`);
      process.exit(2);
    }
    out[name.slice(2)] = argv[i + 1];
  }
  for (const k of ['build', 'tokenizer', 'deps']) {
    if (!out[k]) {
      console.error(`kv_events_router_test: --${k} is required`);
      process.exit(2);
    }
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const requireDeps = createRequire(path.join(path.resolve(args.deps), 'package.json'));
let zmq, msgpack;
try {
  zmq = requireDeps('zeromq');
  msgpack = requireDeps('@msgpack/msgpack');
} catch (e) {
  console.log(`SKIP: the npm packages are not in ${args.deps} (${e.code ?? e.message}); ` +
              'run scripts/setup, or: npm install --prefix .deps/kv-events-sub zeromq@6 ' +
              '@msgpack/msgpack@3');
  process.exit(SKIP);
}
const PREFIXD = path.join(args.build, 'server/prefixd');
const MODEL_TOOL = path.join(args.build, 'tools/prefixd-model');
const PREFIXCTL = path.join(args.build, 'client/prefixctl');
for (const bin of [PREFIXD, MODEL_TOOL, PREFIXCTL]) {
  if (!fs.existsSync(bin)) {
    console.log(`SKIP: ${bin} is not built`);
    process.exit(SKIP);
  }
}

const BLOCK = 16;
// 12 blocks of 16 tokens (the tiny model keeps 1,024 K/V bytes per token on the CPU).
const POOL_BYTES = 12 * BLOCK * 1024;

async function waitFor(what, cond) {
  const deadline = Date.now() + WAIT_MS;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out after ${WAIT_MS} ms waiting for ` +
                  (typeof what === 'function' ? what() : what));
}

// ---- a prefixd process ----

class Server {
  static async start(modelDir, extraFlags = []) {
    const s = new Server();
    s.output = '';
    const dir = extraFlags.indexOf('--cache-dir');
    s.cacheDir = dir >= 0 ? extraFlags[dir + 1] : null;
    s.proc = spawn(PREFIXD, ['--model', modelDir, '--device', 'cpu', '--threads', '1',
                             '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0',
                             '--http-listen', '127.0.0.1:0', '--shutdown-grace', '2s',
                             '--block-size', String(BLOCK), '--kv-cache-bytes', String(POOL_BYTES),
                             '--kv-events', 'tcp://127.0.0.1:*',
                             '--kv-events-replay', 'tcp://127.0.0.1:*',
                             '--kv-events-topic', 'kv',
                             ...extraFlags],
                   { stdio: ['ignore', 'pipe', 'pipe'] });
    s.exited = new Promise((resolve) => s.proc.on('exit', (code, sig) => resolve({ code, sig })));
    const grab = (d) => { s.output += d.toString(); };
    s.proc.stdout.on('data', grab);
    s.proc.stderr.on('data', grab);
    await waitFor('prefixd to start', () => {
      const http = /^prefixd: http on http:\/\/127\.0\.0\.1:(\d+)/m.exec(s.output);
      const metrics = /^prefixd: metrics on http:\/\/127\.0\.0\.1:(\d+)/m.exec(s.output);
      const events = /^prefixd: kv events on (tcp:\/\/\S+), replay on (tcp:\/\/[^\s,]+)/m.exec(s.output);
      if (http && metrics && events) {
        s.httpBase = `http://127.0.0.1:${http[1]}`;
        s.metricsUrl = `http://127.0.0.1:${metrics[1]}/metrics`;
        [s.eventsEndpoint, s.replayEndpoint] = [events[1], events[2]];
        return true;
      }
      if (s.proc.exitCode !== null) throw new Error(`prefixd exited:\n${s.output}`);
      return false;
    });
    return s;
  }

  async stop() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGTERM');
    const { code, sig } = await this.exited;
    assert.equal(code, 0, `prefixd exited with ${code ?? sig}; output:\n${this.output}`);
  }

  // A completion of one token; returns usage.prompt_tokens_details.cached_tokens.
  async complete({ model, prompt, token, salt }) {
    const body = { model, prompt, max_tokens: 1, temperature: 0 };
    if (salt !== undefined) body.cache_salt = salt;
    const headers = { 'content-type': 'application/json' };
    if (token) headers.authorization = `Bearer ${token}`;
    const r = await fetch(`${this.httpBase}/v1/completions`,
                          { method: 'POST', headers, body: JSON.stringify(body) });
    const j = await r.json();
    assert.equal(r.status, 200, JSON.stringify(j));
    const d = j.usage.prompt_tokens_details;
    // Where the cached tokens came from adds up to OpenAI's cached_tokens.
    assert.equal(d.cached_pool_tokens + d.cached_disk_tokens + d.cached_remote_tokens,
                 d.cached_tokens);
    this.lastDetails = d;
    return d.cached_tokens;
  }

  async metric(name) {
    const text = await (await fetch(this.metricsUrl)).text();
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : 0;
  }
}

// ---- the router: the replica's blocks, from its events alone ----

const hex = (b) => b.toString('hex');
// What prefixd puts in extra_keys for a root: its namespace (LP(tenant) || LP(salt), each
// length an 8-byte little-endian integer: server/cache_namespace.h) and its adapter.
function lengthPrefixed(s) {
  const body = Buffer.from(s, 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(body.length));
  return Buffer.concat([len, body]);
}
function rootExtraKeys(tenant, salt, adapterDigest) {
  const ns = Buffer.concat([lengthPrefixed(tenant), lengthPrefixed(salt ?? '')]);
  const keys = [`ns:${hex(crypto.createHash('sha256').update(ns).digest())}`];
  if (adapterDigest) keys.push(`adapter:${adapterDigest}`);
  return keys;
}

// An event as vLLM's positional layout, the type first, from either encoding prefixd writes
// (--kv-events-encoding): an array as it is; a tagged map (vLLM's current wire, the default)
// by its field names, which must be exactly vLLM's, in its declaration order.
const FIELDS = {
  AllBlocksCleared: [],
  BlockStored: ['block_hashes', 'parent_block_hash', 'token_ids', 'block_size', 'lora_id',
                'medium', 'lora_name', 'extra_keys'],
  BlockRemoved: ['block_hashes', 'medium'],
};
function positional(e) {
  if (Array.isArray(e)) return e;
  assert.equal(typeof e, 'object');
  const names = FIELDS[e.type];
  assert.ok(names !== undefined, `an event of unknown type ${e.type}`);
  assert.deepEqual(Object.keys(e), ['type', ...names]);
  return [e.type, ...names.map((n) => e[n])];
}

class Router {
  constructor(server, topic) {
    this.server = server;
    this.forms = new Set();  // 'map' and/or 'array': how the events came
    this.next = 0n;  // the next sequence number expected
    this.resident = new Map();  // `${medium}:${hash}` -> { hash, parent, tokens, extra }
    this.gaps = 0;
    this.diskRemovals = 0;  // BlockRemoved DISK events applied
    this.sub = new zmq.Subscriber();
    this.sub.connect(server.eventsEndpoint);
    this.sub.subscribe(topic);
    this.topic = topic;
    this.loop = this.run();
  }

  async run() {
    try {
      for await (const [topic, seq, payload] of this.sub) {
        assert.equal(topic.toString(), this.topic);
        await this.deliver(seq.readBigInt64BE(), payload);
      }
    } catch (e) {
      if (!this.closed) throw e;
    }
  }

  // Batches apply in sequence order; a gap is filled from the replay socket (a subscriber
  // joins late, ZMQ's slow joiner, and misses the first batches); what the replay no longer
  // has, or a batch the server dropped, stays missing: the server's next batch then begins
  // with AllBlocksCleared and every resident block.
  async deliver(seq, payload) {
    if (seq < this.next) return;
    if (seq > this.next) {
      for (const [s, p] of await this.replay(this.next)) {
        if (s >= this.next && s < seq) this.apply(s, p);
      }
      if (seq > this.next) this.gaps += 1;
    }
    this.apply(seq, payload);
  }

  // Applies what the replay socket has beyond what the live stream delivered. A batch the SUB
  // never received (published before its subscription took effect: ZMQ's slow joiner) is
  // otherwise noticed only when a later one arrives, and the last batch may have none.
  async catchUp() {
    for (const [s, p] of await this.replay(this.next)) {
      if (s >= this.next) this.apply(s, p);
    }
  }

  async replay(from) {
    const dealer = new zmq.Dealer({ receiveTimeout: WAIT_MS, linger: 0 });
    dealer.connect(this.server.replayEndpoint);
    const start = Buffer.alloc(8);
    start.writeBigInt64BE(from);
    await dealer.send([Buffer.alloc(0), start]);
    const out = [];
    while (true) {
      const [empty, seq, payload] = await dealer.receive();
      assert.equal(empty.length, 0);
      const s = seq.readBigInt64BE();
      if (s === -1n) {
        assert.equal(payload.length, 0);
        break;
      }
      out.push([s, payload]);
    }
    dealer.close();
    return out;
  }

  apply(seq, payload) {
    const [ts, events, rank] = msgpack.decode(payload, { useBigInt64: true });
    assert.equal(typeof ts, 'number');
    assert.equal(Number(rank), 0);
    for (const raw of events) {
      this.forms.add(Array.isArray(raw) ? 'array' : 'map');
      const e = positional(raw);
      const type = e[0];
      if (type === 'AllBlocksCleared') {
        assert.equal(e.length, 1);
        this.resident.clear();
      } else if (type === 'BlockStored') {
        assert.equal(e.length, 9);
        const [, hashes, parent, tokens, blockSize, loraId, medium, loraName, extraKeys] = e;
        assert.equal(Number(blockSize), BLOCK);
        assert.equal(hashes.length, 1);
        assert.equal(tokens.length, BLOCK);
        assert.equal(extraKeys.length, 1);
        assert.ok(['CPU', 'DISK'].includes(medium), medium);
        assert.equal(loraId === null, loraName === null);
        const hash = BigInt(hashes[0]);
        this.resident.set(`${medium}:${hash}`, {
          hash, parent: parent === null ? null : BigInt(parent),
          tokens: tokens.map(Number), extra: extraKeys[0], medium, loraName });
      } else {
        assert.equal(type, 'BlockRemoved');
        assert.equal(e.length, 3);
        const [, hashes, medium] = e;
        for (const h of hashes) this.resident.delete(`${medium}:${BigInt(h)}`);
        if (medium === 'DISK') this.diskRemovals += hashes.length;
      }
    }
    this.next = seq + 1n;
  }

  // Whole blocks of `prompt` this replica holds under a root, in any medium, as prefixd
  // serves them: the pool's, then the disk's. A first block of unknown identity (no
  // extra_keys: a disk file found at start-up, whose tenant prefixd cannot name) may be
  // anyone's; this router takes it for the request's, which is exact for the disk replica
  // here (one tenant) and may over-predict where several tenants send the same first tokens.
  predict(prompt, extra) {
    const index = new Map();
    for (const b of this.resident.values()) {
      const parentKey = b.parent === null ? `root:${JSON.stringify(b.extra)}` : String(b.parent);
      index.set(`${parentKey}|${b.tokens.join(',')}`, b.hash);
    }
    let parentKey = `root:${JSON.stringify(extra)}`;
    let blocks = 0;
    for (; (blocks + 1) * BLOCK <= prompt.length; ++blocks) {
      const tokens = prompt.slice(blocks * BLOCK, (blocks + 1) * BLOCK).join(',');
      let h = index.get(`${parentKey}|${tokens}`);
      if (h === undefined && blocks === 0) h = index.get(`root:[]|${tokens}`);
      if (h === undefined) break;
      parentKey = String(h);
    }
    // The last prompt token is always computed (cached_prompt_tokens <= prompt - 1).
    return Math.min(blocks * BLOCK, prompt.length - 1);
  }

  has(pred) {
    for (const b of this.resident.values()) if (pred(b)) return true;
    return false;
  }

  close() {
    this.closed = true;
    this.sub.close();
  }
}

// ---- the workload ----

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prefixd-kv-events-'));
const modelDir = path.join(tmp, 'tiny');
const adapterDir = path.join(tmp, 'sql');
const TOKENS = { 'team-a': 'kv-token-a', 'team-b': 'kv-token-b' };
let sentinels = 0;

const ids = (seed, n) => Array.from({ length: n }, (_, i) => 100 + ((seed * 7919 + i * 37) % 5000));

// The block hashes of the files in a disk tier's directory, <layout id>-<hex chain key>.kvb
// (a block's hash is the first 8 bytes of its chain key, big-endian).
function diskFileHashes(dir) {
  const out = new Set();
  for (const name of fs.readdirSync(dir)) {
    const m = /^[0-9a-f]{16}-([0-9a-f]{64})\.kvb$/.exec(name);
    if (m) out.add(BigInt(`0x${m[1].slice(0, 16)}`));
  }
  return out;
}

// Makes sure the router has seen every event of the requests before: a sentinel request in
// a namespace of its own (never matched by the workload) whose block's BlockStored comes
// after them on the stream. With the disk tier also waits until the tier has written every
// spill (none queued) and the router's DISK blocks are the directory's files: a file is
// reported when written and when deleted, so until then the router may lag the directory.
// The sentinel is part of the replica's state, so the prediction that follows includes it.
async function sync(server, router, { disk = false, token, tenant = 'default' } = {}) {
  const salt = `sentinel-${++sentinels}`;
  const prompt = ids(90000 + sentinels, BLOCK + 1);
  await server.complete({ model: 'tiny', prompt, token, salt });
  const extra = rootExtraKeys(tenant, salt);
  await waitFor(() => `the router to see sentinel ${salt} (next seq ${router.next}, ` +
                      `${router.resident.size} blocks)`, async () => {
    if (router.has((b) => b.parent === null && JSON.stringify(b.extra) === JSON.stringify(extra))) {
      return true;
    }
    await router.catchUp();
    return false;
  });
  if (disk) {
    let queued = 0, seen = 0, files = 0;
    await waitFor(() => `the disk tier's writes to land and the router to see them (${queued} ` +
                        `queued; the router holds ${seen} DISK blocks, the directory ${files} ` +
                        'files)', async () => {
      queued = await server.metric('prefixd_disk_cache_queued_blocks');
      if (queued !== 0) return false;
      const onDisk = diskFileHashes(server.cacheDir);
      const mine = new Set();
      for (const b of router.resident.values()) if (b.medium === 'DISK') mine.add(b.hash);
      [seen, files] = [mine.size, onDisk.size];
      if (mine.size === onDisk.size && [...mine].every((h) => onDisk.has(h))) return true;
      await router.catchUp();
      return false;
    });
  }
}

// Predicts, sends, and checks predicted <= cached < predicted + BLOCK; returns both.
async function check(server, router, req, { disk = false } = {}) {
  await sync(server, router, { disk, token: req.token, tenant: req.tenant });
  const predicted = router.predict(req.prompt, rootExtraKeys(req.tenant ?? 'default', req.salt,
                                                              req.adapterDigest));
  const cached = await server.complete(req);
  assert.ok(predicted <= cached && cached < predicted + BLOCK,
            `predicted ${predicted}, server cached ${cached} (block ${BLOCK})`);
  return { predicted, cached };
}

let plain, disk, adapterDigest, diskDir;
let plainRouter, diskRouter;

before(async () => {
  let r = spawnSync(MODEL_TOOL, ['random', '--out', modelDir, '--preset', 'tiny',
                                 '--tokenizer-dir', args.tokenizer], { encoding: 'utf8' });
  assert.equal(r.status, 0, `prefixd-model random failed: ${r.stdout}${r.stderr}`);
  r = spawnSync(MODEL_TOOL, ['random-adapter', '--base', modelDir, '--out', adapterDir],
                { encoding: 'utf8' });
  assert.equal(r.status, 0, `prefixd-model random-adapter failed: ${r.stdout}${r.stderr}`);
  const tokens = path.join(tmp, 'tokens');
  fs.writeFileSync(tokens, Object.entries(TOKENS).map(([t, k]) => `${k} ${t}`).join('\n') + '\n');
  diskDir = path.join(tmp, 'disk');
  [plain, disk] = await Promise.all([
    Server.start(modelDir, ['--auth-tokens', tokens, '--adapter', `sql=${adapterDir}`]),
    // The disk replica writes vLLM's earlier array-like events; the other the default maps.
    Server.start(modelDir, ['--cache-dir', diskDir, '--cache-dir-bytes', String(64 << 20),
                            '--kv-events-encoding', 'array'])]);
  adapterDigest = /^prefixd: adapter sql: .*sha256 ([0-9a-f]{64})$/m.exec(plain.output)[1];
  plainRouter = new Router(plain, 'kv');
  diskRouter = new Router(disk, 'kv');
});

after(async () => {
  plainRouter?.close();
  diskRouter?.close();
  await Promise.all([plain?.stop(), disk?.stop()]);
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('a router rebuilt from the KV events predicts cached prompt tokens', () => {
  test('through a workload that overflows the pool (evictions)', async () => {
    const a = { token: TOKENS['team-a'], tenant: 'team-a', model: 'tiny' };
    const prompts = [1, 2, 3, 4, 5, 6].map((s) => ids(s, 3 * BLOCK + 5));
    let hits = 0, misses = 0;
    for (const p of prompts) await check(plain, plainRouter, { ...a, prompt: p });
    // 6 prompts of 4 blocks in 12 blocks: the first ones were evicted, the last are cached.
    for (const p of [...prompts].reverse()) {
      // The same prefix, then new tokens: a partial reuse of what is left.
      const q = [...p.slice(0, 2 * BLOCK + 3), ...ids(77, 20)];
      const { predicted } = await check(plain, plainRouter, { ...a, prompt: q });
      if (predicted > 0) hits += 1; else misses += 1;
    }
    assert.ok(hits > 0, 'no prompt was still cached: the workload checks nothing');
    assert.ok(misses > 0, 'no prompt was evicted: the workload checks nothing');
    const removed = await plain.metric('prefixd_kv_evictions_total');
    assert.ok(removed > 0);
    assert.equal(plainRouter.gaps, 0);
  });

  test('with two tenants sending the same prompt', async () => {
    const prompt = ids(200, 2 * BLOCK + 7);
    const a = { token: TOKENS['team-a'], tenant: 'team-a', model: 'tiny', prompt };
    const b = { token: TOKENS['team-b'], tenant: 'team-b', model: 'tiny', prompt };
    assert.equal((await check(plain, plainRouter, a)).predicted, 0);
    // team-a's blocks are not team-b's: the router sees two roots.
    assert.equal((await check(plain, plainRouter, b)).predicted, 0);
    assert.equal((await check(plain, plainRouter, a)).predicted, 2 * BLOCK);
    assert.equal((await check(plain, plainRouter, b)).predicted, 2 * BLOCK);
    // A salt narrows within a tenant.
    assert.equal((await check(plain, plainRouter, { ...a, salt: 'narrow' })).predicted, 0);
  });

  test('with a LoRA adapter', async () => {
    const prompt = ids(300, 2 * BLOCK + 2);
    const base = { token: TOKENS['team-a'], tenant: 'team-a', model: 'tiny', prompt };
    const sql = { ...base, model: 'sql', adapterDigest };
    assert.equal((await check(plain, plainRouter, base)).predicted, 0);
    assert.equal((await check(plain, plainRouter, sql)).predicted, 0);
    assert.equal((await check(plain, plainRouter, sql)).predicted, 2 * BLOCK);
    assert.ok(plainRouter.has((b) => b.loraName === 'sql' &&
                                     b.extra.includes(`adapter:${adapterDigest}`)));
    assert.equal((await check(plain, plainRouter, base)).predicted, 2 * BLOCK);
  });

  test('with the disk tier (spills are stored on DISK)', async () => {
    const opts = { disk: true };
    const prompts = [11, 12, 13, 14, 15, 16].map((s) => ids(s, 3 * BLOCK + 5));
    for (const p of prompts) await check(disk, diskRouter, { model: 'tiny', prompt: p }, opts);
    assert.ok(diskRouter.has((b) => b.medium === 'DISK'), 'nothing was spilled');
    const first = (p) => p.slice(0, BLOCK).join(',');
    const onlyOnDisk = (p) =>
      diskRouter.has((b) => b.medium === 'DISK' && b.tokens.join(',') === first(p)) &&
      !diskRouter.has((b) => b.medium === 'CPU' && b.tokens.join(',') === first(p));
    let fromDisk = 0;
    for (const p of prompts) {
      await sync(disk, diskRouter, opts);
      const diskOnly = onlyOnDisk(p);
      const { predicted } = await check(disk, diskRouter, { model: 'tiny', prompt: p }, opts);
      assert.equal(predicted, 3 * BLOCK);  // every prompt is in the pool or on disk
      if (diskOnly) {
        fromDisk += 1;
        // The usage says where: the disk tier's blocks (the pool held none of them).
        assert.equal(disk.lastDetails.cached_disk_tokens, 3 * BLOCK);
        assert.equal(disk.lastDetails.cached_pool_tokens, 0);
      }
    }
    assert.ok(fromDisk > 0, 'no prompt was served from the disk tier alone');
    assert.ok((await disk.metric('prefixd_disk_cache_hit_tokens_total')) > 0);
  });

  test('after a restart over the same cache dir, and while the disk cap deletes files',
       async () => {
    const opts = { disk: true };
    const restart = async (capBytes) => {
      diskRouter.close();
      await disk.stop();  // the shutdown writes the pool's blocks to disk too
      disk = await Server.start(modelDir, ['--cache-dir', diskDir,
                                           '--cache-dir-bytes', String(capBytes),
                                           '--kv-events-encoding', 'array']);
      diskRouter = new Router(disk, 'kv');
    };
    const old = [11, 12, 13, 14, 15, 16].map((s) => ids(s, 3 * BLOCK + 5));
    await restart(64 << 20);
    await sync(disk, diskRouter, opts);
    // Every file found is on DISK, parents first, without identity: no request named its
    // root yet.
    assert.ok(diskRouter.has((b) => b.medium === 'DISK' && b.parent === null &&
                                    b.extra.length === 0 && b.loraName === null));
    let first = true;
    for (const p of old) {
      const { predicted } = await check(disk, diskRouter, { model: 'tiny', prompt: p }, opts);
      assert.equal(predicted, 3 * BLOCK);
      if (first) {  // the pool was empty: all of it from the files found at start-up
        assert.equal(disk.lastDetails.cached_disk_tokens, 3 * BLOCK);
        first = false;
      }
    }

    // Room for 12 block files (a tiny model's block record is 16,696 bytes; more with a score
    // section): the files over it go at start-up, unreported; then new prompts' spills make
    // the tier delete its least recently used files, each a removal from DISK.
    await restart(12 * 16696);
    await sync(disk, diskRouter, opts);
    assert.ok((await disk.metric('prefixd_disk_cache_blocks')) <= 12);
    // A check churns about 4 blocks (its prompt's 3 and a sentinel's): the pool holds about
    // three checks' blocks, the disk three more. The old prompts, then new ones, then the new
    // ones again from the latest: some from the pool, some from the files left, some gone.
    const fresh = [21, 22, 23, 24, 25, 26].map((s) => ids(s, 3 * BLOCK + 5));
    let diskHits = 0, misses = 0;
    for (const p of [...old, ...fresh, ...[...fresh].reverse()]) {
      const { predicted } = await check(disk, diskRouter, { model: 'tiny', prompt: p }, opts);
      if (disk.lastDetails.cached_disk_tokens > 0) diskHits += 1;
      if (predicted === 0) misses += 1;
    }
    assert.ok(diskHits > 0, 'nothing came from the disk: the workload checks nothing');
    assert.ok(misses > 0, 'nothing was deleted: the workload checks nothing');
    assert.ok((await disk.metric('prefixd_disk_cache_evicted_files_total')) > 0,
              'the cap deleted nothing: the workload checks nothing');
    assert.ok(diskRouter.diskRemovals > 0, 'no BlockRemoved DISK was seen');
    assert.equal(diskRouter.gaps, 0);
    assert.deepEqual([...diskRouter.forms], ['array']);
  });

  test('replay returns what was published, byte for byte', async () => {
    const all = await plainRouter.replay(0n);
    assert.equal(all[0][0], 0n);
    for (let i = 1; i < all.length; ++i) assert.equal(all[i][0], all[i - 1][0] + 1n);
    assert.deepEqual(msgpack.decode(all[0][1])[1], [{ type: 'AllBlocksCleared' }]);
    assert.deepEqual([...plainRouter.forms], ['map']);
    // A second subscriber rebuilt from the replay alone holds what the live one holds.
    const fresh = new Map();
    const r2 = Object.create(Router.prototype);
    r2.resident = fresh;
    r2.forms = new Set();
    r2.next = 0n;
    for (const [s, p] of all) r2.apply(s, p);
    const upTo = all[all.length - 1][0];
    await waitFor('the live router to reach the replay', () => plainRouter.next > upTo);
    if (plainRouter.next === upTo + 1n) {
      assert.deepEqual([...fresh.keys()].sort(), [...plainRouter.resident.keys()].sort());
    }
    // prefixctl events prints the same stream, one line per event.
    let events = 0;
    for (const [, p] of all) events += msgpack.decode(p)[1].length;
    const r = spawnSync(PREFIXCTL, ['events', '--kv-events', plain.eventsEndpoint, '--topic', 'kv',
                                    '--replay', plain.replayEndpoint, '--count', String(events)],
                        { encoding: 'utf8', timeout: WAIT_MS });
    assert.equal(r.status, 0, `prefixctl events failed: ${r.stdout}${r.stderr}`);
    const lines = r.stdout.trim().split('\n');
    assert.equal(lines.length, events);
    assert.match(lines[0], /^seq 0 ts \S+ AllBlocksCleared$/);
    assert.ok(lines.some((l) => / BlockStored hash [0-9a-f]{16} parent - medium CPU tokens 16 /.test(l)));
    assert.ok(lines.some((l) => / BlockRemoved hash [0-9a-f]{16} medium CPU$/.test(l)));
    assert.ok(lines.some((l) => / lora sql extra ns:[0-9a-f]{64},adapter:/.test(l)));
    assert.equal(await plain.metric('prefixd_kv_events_dropped_total'), 0);
    assert.ok((await plain.metric('prefixd_kv_events_published_total')) >= all.length);
  });
});
