// The official `openai` npm SDK (version 7) against a running prefixd: the real binary on a
// tiny random model, every listener on 127.0.0.1 port 0. What the SDK gets over HTTP is
// compared with what the gRPC API (@grpc/grpc-js) gets for the same prompt ids and seed.
//
//   node openai_sdk_test.mjs --build BUILD --tokenizer DIR --deps DIR --proto FILE
//
// --deps is the npm prefix holding openai@7, @grpc/grpc-js and @grpc/proto-loader
// (scripts/setup installs them into .deps/openai-sdk). Without them, or without the built
// binaries, the test exits 77 (ctest: skipped) saying what is missing.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

const SKIP = 77;

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i];
    if (!name.startsWith('--') || i + 1 >= argv.length) {
      console.error(`openai_sdk_test: bad argument '${name}' (--build --tokenizer --deps --proto)`);
      process.exit(2);
    }
    out[name.slice(2)] = argv[i + 1];
  }
  for (const k of ['build', 'tokenizer', 'deps', 'proto']) {
    if (!out[k]) {
      console.error(`openai_sdk_test: --${k} is required`);
      process.exit(2);
    }
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const requireDeps = createRequire(path.join(path.resolve(args.deps), 'package.json'));
let OpenAI, grpc, protoLoader;
try {
  ({ OpenAI } = requireDeps('openai'));
  grpc = requireDeps('@grpc/grpc-js');
  protoLoader = requireDeps('@grpc/proto-loader');
} catch (e) {
  console.log(`SKIP: the npm packages are not in ${args.deps} (${e.code ?? e.message}); ` +
              'run scripts/setup, or: npm install --prefix .deps/openai-sdk openai@7 ' +
              '@grpc/grpc-js @grpc/proto-loader');
  process.exit(SKIP);
}
const sdkVersion = JSON.parse(
  fs.readFileSync(path.join(path.resolve(args.deps), 'node_modules/openai/package.json'))).version;
if (!sdkVersion.startsWith('7.')) {
  console.log(`SKIP: the test is written for openai@7, ${args.deps} holds ${sdkVersion}`);
  process.exit(SKIP);
}
const PREFIXD = path.join(args.build, 'server/prefixd');
const MODEL_TOOL = path.join(args.build, 'tools/prefixd-model');
for (const bin of [PREFIXD, MODEL_TOOL]) {
  if (!fs.existsSync(bin)) {
    console.log(`SKIP: ${bin} is not built`);
    process.exit(SKIP);
  }
}

// ---- a prefixd process ----

class Server {
  static async start(modelDir, extraFlags = []) {
    const s = new Server();
    s.output = '';
    s.proc = spawn(PREFIXD, ['--model', modelDir, '--device', 'cpu', '--threads', '1',
                             '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0',
                             '--http-listen', '127.0.0.1:0', '--shutdown-grace', '2s',
                             ...extraFlags],
                   { stdio: ['ignore', 'pipe', 'pipe'] });
    s.exited = new Promise((resolve) => s.proc.on('exit', (code, sig) => resolve({ code, sig })));
    const grab = (d) => { s.output += d.toString(); };
    s.proc.stdout.on('data', grab);
    s.proc.stderr.on('data', grab);
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      const grpcPort = /^prefixd: listening on 127\.0\.0\.1:(\d+)$/m.exec(s.output);
      const httpPort = /^prefixd: http on http:\/\/127\.0\.0\.1:(\d+)/m.exec(s.output);
      if (grpcPort && httpPort) {
        s.grpcAddress = `127.0.0.1:${grpcPort[1]}`;
        s.httpBase = `http://127.0.0.1:${httpPort[1]}`;
        return s;
      }
      if (s.proc.exitCode !== null) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    s.proc.kill('SIGKILL');
    throw new Error(`prefixd did not start; its output:\n${s.output}`);
  }

  async stop() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGTERM');
    const { code, sig } = await this.exited;
    assert.equal(code, 0, `prefixd exited with ${code ?? sig}; output:\n${this.output}`);
  }
}

// ---- the gRPC side ----

function grpcClient(address, token) {
  const def = protoLoader.loadSync(args.proto,
                                   { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  const { Inference } = grpc.loadPackageDefinition(def).prefixd.v1;
  const client = new Inference(address, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  return { client, metadata };
}

// Runs Generate to the end; returns one entry per sample (text, ids, logprobs, top logprobs,
// finish reason) and the usage.
function grpcGenerate({ client, metadata }, request) {
  return new Promise((resolve, reject) => {
    const samples = [];
    let usage = null;
    let prompt = null;
    const call = client.Generate(request, metadata);
    call.on('data', (m) => {
      if (m.prompt_token_ids.length > 0) {
        // The prompt-logprobs message, before any generated token.
        prompt = { ids: m.prompt_token_ids, logprobs: m.prompt_logprobs,
                   top: m.prompt_top_logprobs };
        return;
      }
      const s = (samples[m.sample_index] ??=
        { text: '', ids: [], logprobs: [], top: [], finish: 'FINISH_REASON_UNSPECIFIED' });
      s.text += m.text;
      s.ids.push(...m.token_ids);
      s.logprobs.push(...m.logprobs);
      s.top.push(...m.top_logprobs);
      if (m.finish_reason !== 'FINISH_REASON_UNSPECIFIED') s.finish = m.finish_reason;
      if (m.usage) usage = m.usage;
    });
    call.on('error', reject);
    call.on('end', () => resolve({ samples, usage, prompt }));
  });
}

const FINISH = { FINISH_REASON_LENGTH: 'length', FINISH_REASON_STOP: 'stop' };

// What the HTTP side must equal, from the gRPC side.
function expectSameAsGrpc(choices, usage, grpcResult, what) {
  assert.equal(choices.length, grpcResult.samples.length, `${what}: number of choices`);
  choices.forEach((c, i) => {
    const g = grpcResult.samples[i];
    assert.equal(c.index, i, `${what}: choice ${i} index`);
    assert.equal(c.text, g.text, `${what}: choice ${i} text`);
    assert.equal(c.finish_reason, FINISH[g.finish], `${what}: choice ${i} finish_reason`);
  });
  assert.equal(usage.prompt_tokens, grpcResult.usage.prompt_tokens, `${what}: prompt_tokens`);
  assert.equal(usage.completion_tokens, grpcResult.usage.completion_tokens,
               `${what}: completion_tokens`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens,
               `${what}: total_tokens`);
}

// The SDK's stream, gathered into whole choices (by index) and the usage chunk.
async function gatherStream(stream) {
  const choices = [];
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0, 'the usage chunk carries no choices');
      usage = chunk.usage;
    }
    for (const d of chunk.choices) {
      const c = (choices[d.index] ??= { index: d.index, text: '', finish_reason: null,
                                        logprobs: d.logprobs ? { tokens: [], token_logprobs: [],
                                                                 top_logprobs: [], text_offset: [] }
                                                             : null });
      assert.equal(c.finish_reason, null, `choice ${d.index} has text after its finish_reason`);
      c.text += d.text;
      if (d.logprobs) {
        for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) {
          c.logprobs[k].push(...d.logprobs[k]);
        }
      }
      if (d.finish_reason) c.finish_reason = d.finish_reason;
    }
  }
  return { choices, usage, chunks };
}

// ---- the test ----

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prefixd-sdk-'));
const modelDir = path.join(tmp, 'tiny');
const TOKEN = 'sdk-test-token-1';
let server, authServer, openai, grpcSide, modelName;

// A prompt of distinct ids (no text round trip), long enough for several 16-token blocks.
const promptIds = (first, n) => Array.from({ length: n }, (_, i) => 100 + ((first + i * 37) % 5000));

before(async () => {
  const r = spawnSync(MODEL_TOOL, ['random', '--out', modelDir, '--preset', 'tiny',
                                   '--tokenizer-dir', args.tokenizer], { encoding: 'utf8' });
  assert.equal(r.status, 0, `prefixd-model random failed: ${r.stdout}${r.stderr}`);
  modelName = path.basename(modelDir);
  const tokens = path.join(tmp, 'tokens');
  fs.writeFileSync(tokens, `# token tenant\n${TOKEN} team-a\n`);
  [server, authServer] = await Promise.all([
    Server.start(modelDir), Server.start(modelDir, ['--auth-tokens', tokens])]);
  // SDKs always send a key; without --auth-tokens the server ignores it.
  openai = new OpenAI({ baseURL: `${server.httpBase}/v1`, apiKey: 'ignored', maxRetries: 0 });
  grpcSide = grpcClient(server.grpcAddress);
});

after(async () => {
  grpcSide?.client.close();
  await Promise.all([server?.stop(), authServer?.stop()]);
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('openai SDK against prefixd', () => {
  test('models.list names the served model', async () => {
    const list = await openai.models.list();
    assert.deepEqual(list.data.map((m) => m.id), [modelName]);
    assert.equal(list.data[0].owned_by, 'prefixd');
  });

  test('a completion equals gRPC for the same ids and seed', async () => {
    const prompt = promptIds(1, 40);
    const c = await openai.completions.create({
      model: modelName, prompt, max_tokens: 12, temperature: 1, seed: 1234, cache_salt: 'eq1' });
    assert.equal(c.object, 'text_completion');
    assert.equal(c.model, modelName);
    assert.match(c.id, /^cmpl-/);
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 12, temperature: 1, seed: '1234',
      cache_salt: 'eq1' });
    expectSameAsGrpc(c.choices, c.usage, g, 'non-streamed');
    assert.equal(c.usage.prompt_tokens, 40);
    assert.equal(c.choices[0].logprobs, null, 'no logprobs unless asked');
  });

  test('a streamed completion equals gRPC, usage in the last chunk', async () => {
    const prompt = promptIds(2, 33);
    const stream = await openai.completions.create({
      model: modelName, prompt, max_tokens: 20, temperature: 0.8, top_k: 50, seed: 99,
      stream: true, stream_options: { include_usage: true }, cache_salt: 'eq2' });
    const got = await gatherStream(stream);
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 20, temperature: 0.8, top_k: 50, seed: '99',
      cache_salt: 'eq2' });
    assert.ok(got.usage, 'include_usage gives a usage chunk');
    expectSameAsGrpc(got.choices, got.usage, g, 'streamed');
    assert.ok(got.chunks >= 2, `streamed in more than one chunk (got ${got.chunks})`);
  });

  test('a text prompt streamed without include_usage has no usage chunk', async () => {
    const stream = await openai.completions.create({
      prompt: 'The quick brown fox', max_tokens: 5, temperature: 0, stream: true });
    const got = await gatherStream(stream);
    assert.equal(got.usage, null);
    assert.equal(got.choices.length, 1);
    assert.equal(got.choices[0].finish_reason, 'length');
  });

  test('a repeated prompt reports cached_tokens, as gRPC does', async () => {
    const prompt = promptIds(3, 70);  // 4 whole 16-token blocks and a part
    const req = { model: modelName, prompt, max_tokens: 2, temperature: 0, cache_salt: 'rep' };
    const first = await openai.completions.create(req);
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
    const second = await openai.completions.create(req);
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assert.equal(cached, 64, 'the whole blocks of the prompt come from the cache');
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 2, temperature: 0, cache_salt: 'rep' });
    assert.equal(g.usage.cached_prompt_tokens, cached, 'gRPC shares the cache');
    assert.equal(second.choices[0].text, first.choices[0].text);
  });

  test('logprobs match gRPC top_logprobs', async () => {
    const prompt = promptIds(4, 20);
    const c = await openai.completions.create({
      model: modelName, prompt, max_tokens: 8, temperature: 1, seed: 7, logprobs: 3 });
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 8, temperature: 1, seed: '7', top_logprobs: 3 });
    expectSameAsGrpc(c.choices, c.usage, g, 'logprobs');
    const lp = c.choices[0].logprobs;
    const s = g.samples[0];
    assert.equal(lp.tokens.length, 8);
    assert.deepEqual(lp.token_logprobs, s.logprobs);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < 8; ++i) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    lp.top_logprobs.forEach((top, i) => {
      const values = Object.values(top);
      // OpenAI's "up to logprobs+1": the sampled token is listed when it is not in the top 3.
      assert.ok(values.length >= 1 && values.length <= 4, `step ${i}: ${values.length} entries`);
      assert.equal(top[lp.tokens[i]], lp.token_logprobs[i], `step ${i}: the sampled token`);
      // Entries keep the first of two ids with the same name; every value is one of gRPC's
      // (its top entries, or the sampled token's).
      for (const v of values) {
        assert.ok(s.top[i].logprobs.includes(v) || v === s.logprobs[i], `step ${i}: ${v}`);
      }
      // A JSON object has no order (prefixd's keys come sorted by name): compare the maximum.
      assert.equal(Math.max(...values), s.top[i].logprobs[0], `step ${i}: the most probable`);
    });
    // Streamed logprobs are the same, with offsets into the whole text.
    const streamed = await gatherStream(await openai.completions.create({
      model: modelName, prompt, max_tokens: 8, temperature: 1, seed: 7, logprobs: 3,
      stream: true }));
    assert.deepEqual(streamed.choices[0].logprobs, lp);
  });

  // lm-evaluation-harness's local-completions loglikelihood request, exactly: a batch of
  // token-id prompts (one context, four continuations), echo with logprobs 1, one greedy
  // token. It reads token_logprobs[ctxlen:-1] and compares each top_logprobs entry with the
  // echoed token (is_greedy). Every prompt score equals gRPC's prompt_logprobs; the second
  // batch, served from the cache's score records, is the same.
  test('lm-eval local-completions loglikelihood requests: echo + logprobs', async () => {
    const context = promptIds(9, 45);
    const conts = [3, 7, 12, 20].map((n, k) => promptIds(300 + k, n));
    const prompts = conts.map((c) => [...context, ...c]);
    const request = { model: modelName, prompt: prompts, temperature: 0, max_tokens: 1,
                      logprobs: 1, seed: 1234, echo: true };
    const first = await openai.completions.create(request);
    assert.equal(first.choices.length, 4);
    for (const [i, c] of first.choices.entries()) {
      const lp = c.logprobs;
      const n = prompts[i].length;
      assert.equal(c.index, i);
      assert.equal(lp.tokens.length, n + 1, `choice ${i}: prompt tokens then the generated one`);
      assert.equal(lp.token_logprobs.length, n + 1);
      assert.equal(lp.token_logprobs[0], null);
      assert.equal(lp.top_logprobs[0], null);
      assert.equal(lp.text_offset[0], 0);
      const g = await grpcGenerate(grpcSide, {
        token_ids: { ids: prompts[i] }, max_new_tokens: 1, temperature: 0, seed: '1234',
        top_logprobs: 1, prompt_logprobs: 1 });
      assert.deepEqual(g.prompt.ids, prompts[i]);
      assert.deepEqual(lp.token_logprobs.slice(1, n), g.prompt.logprobs, `choice ${i}`);
      assert.deepEqual(lp.token_logprobs.slice(n), g.samples[0].logprobs);
      // What lm-eval computes: the continuation's sum and whether it is greedy.
      const ctxlen = context.length;
      const sum = lp.token_logprobs.slice(ctxlen, -1).reduce((a, b) => a + b, 0);
      assert.ok(Number.isFinite(sum) && sum < 0, `choice ${i}: sum ${sum}`);
      for (let p = 1; p < n; ++p) {
        // The most likely entry, and the prompt token itself when it is not that one.
        const top = Object.values(lp.top_logprobs[p]);
        assert.ok(top.length >= 1 && top.length <= 2, `choice ${i} position ${p}`);
        assert.equal(Math.max(...top), g.prompt.top[p - 1].logprobs[0],
                     `choice ${i} position ${p}`);
        assert.equal(lp.top_logprobs[p][lp.tokens[p]], lp.token_logprobs[p]);
      }
    }
    const again = await openai.completions.create(request);
    // Every prompt's 45-token context is 2 blocks with score records: 31 positions each.
    assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 4 * 31,
              `cached_tokens ${again.usage.prompt_tokens_details.cached_tokens}`);
    assert.deepEqual(again.choices.map((c) => c.logprobs), first.choices.map((c) => c.logprobs));
    // Streamed, the prompt is each choice's first chunk; gathered, the same logprobs.
    const streamed = await gatherStream(await openai.completions.create({ ...request, stream: true }));
    assert.deepEqual(streamed.choices.map((c) => c.logprobs.token_logprobs),
                     first.choices.map((c) => c.logprobs.token_logprobs));
  });

  test('stop strings cut the text as in gRPC, streamed or not', async () => {
    const prompt = promptIds(5, 12);
    const base = { model: modelName, prompt, max_tokens: 40, temperature: 0, ignore_eos: true };
    const full = (await openai.completions.create(base)).choices[0].text;
    // A printable 4-character window after the start: likely to span a token boundary.
    let at = -1;
    for (let i = 3; i + 4 <= full.length && at < 0; ++i) {
      if (/^[\x21-\x7e ]{4}$/.test(full.slice(i, i + 4)) && full.indexOf(full.slice(i, i + 4)) === i) at = i;
    }
    assert.ok(at >= 0, `no printable window to stop at in ${JSON.stringify(full)}`);
    const stop = full.slice(at, at + 4);
    const c = await openai.completions.create({ ...base, stop: [stop, '\u0000never'] });
    assert.equal(c.choices[0].text, full.slice(0, at), `stop ${JSON.stringify(stop)}`);
    assert.equal(c.choices[0].finish_reason, 'stop');
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 40, temperature: 0, ignore_eos: true,
      stop: [stop, '\u0000never'] });
    expectSameAsGrpc(c.choices, c.usage, g, 'stop');
    assert.ok(c.usage.completion_tokens < 40);
    const streamed = await gatherStream(await openai.completions.create({
      ...base, stop, stream: true, stream_options: { include_usage: true } }));
    assert.equal(streamed.choices[0].text, full.slice(0, at));
    assert.equal(streamed.choices[0].finish_reason, 'stop');
    assert.equal(streamed.usage.completion_tokens, c.usage.completion_tokens);
  });

  test('n with a seed: each choice equals gRPC\'s sample, and repeats', async () => {
    const prompt = promptIds(6, 25);
    const req = { model: modelName, prompt, max_tokens: 10, temperature: 1, n: 3, seed: 42 };
    const c = await openai.completions.create(req);
    const g = await grpcGenerate(grpcSide, {
      token_ids: { ids: prompt }, max_new_tokens: 10, temperature: 1, num_samples: 3, seed: '42' });
    expectSameAsGrpc(c.choices, c.usage, g, 'n=3');
    assert.ok(new Set(c.choices.map((x) => x.text)).size > 1, 'samples differ from each other');
    const again = await openai.completions.create(req);
    assert.deepEqual(again.choices.map((x) => x.text), c.choices.map((x) => x.text));
    const streamed = await gatherStream(await openai.completions.create({ ...req, stream: true }));
    assert.deepEqual(streamed.choices.map((x) => x.text), c.choices.map((x) => x.text));
  });

  test('a bad request is a BadRequestError naming the parameter', async () => {
    const cases = [
      [{ max_tokens: -1 }, 'max_tokens'],
      [{ logprobs: 6 }, 'logprobs'],
      [{ best_of: 2 }, 'best_of'],
      [{ suffix: 'x' }, 'suffix'],
      [{ not_a_field: 1 }, 'not_a_field'],
      [{ n: 1000 }, 'n'],
    ];
    for (const [fields, param] of cases) {
      await assert.rejects(
        openai.completions.create({ model: modelName, prompt: 'hi', ...fields }),
        (e) => {
          assert.ok(e instanceof OpenAI.BadRequestError, `${param}: ${e.constructor.name} ${e}`);
          assert.equal(e.status, 400);
          assert.equal(e.param, param);
          assert.equal(e.type, 'invalid_request_error');
          assert.ok(e.message.length > 0);
          return true;
        });
    }
  });

  test('another model name is a NotFoundError', async () => {
    await assert.rejects(
      openai.completions.create({ model: 'gpt-4', prompt: 'hi', max_tokens: 1 }),
      (e) => {
        assert.ok(e instanceof OpenAI.NotFoundError, `${e.constructor.name} ${e}`);
        assert.equal(e.status, 404);
        assert.equal(e.code, 'model_not_found');
        assert.equal(e.param, 'model');
        assert.match(e.message, new RegExp(modelName));
        return true;
      });
  });

  test('with --auth-tokens a wrong key is an AuthenticationError, the right one serves', async () => {
    for (const apiKey of ['wrong-token']) {
      const bad = new OpenAI({ baseURL: `${authServer.httpBase}/v1`, apiKey, maxRetries: 0 });
      await assert.rejects(bad.completions.create({ prompt: 'hi', max_tokens: 1 }), (e) => {
        assert.ok(e instanceof OpenAI.AuthenticationError, `${e.constructor.name} ${e}`);
        assert.equal(e.status, 401);
        assert.equal(e.type, 'authentication_error');
        return true;
      });
    }
    const good = new OpenAI({ baseURL: `${authServer.httpBase}/v1`, apiKey: TOKEN, maxRetries: 0 });
    const c = await good.completions.create({ prompt: promptIds(7, 10), max_tokens: 3, seed: 5 });
    const g = await grpcGenerate(grpcClient(authServer.grpcAddress, TOKEN), {
      token_ids: { ids: promptIds(7, 10) }, max_new_tokens: 3, temperature: 1, seed: '5' });
    expectSameAsGrpc(c.choices, c.usage, g, 'authenticated');
  });
});
