// llama.cpp (prebuilt, through node-llama-cpp) measured the way bench/cpu_backend_bench.cc
// measures prefixd's CPU backend, on a GGUF written by bench/gguf_export from the same model.
//
//   node peer_bench.mjs MODEL.gguf [--threads 2] [--reps 5] [--steps 8]
//   node peer_bench.mjs MODEL.gguf --threads 2 --kv F32 --flash-attention off --check OURS.json
//
// Speed mode prints the rows of cpu_backend_bench's table for the same measurements (its
// --quick 5 set), same token ids (Tokens() below is its generator), best of --reps:
//   - prefill of a 17- and a 512-token prompt from position 0: one llama_decode of the whole
//     prompt (batch size 512) with logits for the last position only, as ours computes;
//   - decode at batch 1 after 16 and 256 tokens of context: --steps single-token steps, each
//     with its logits, timed per step; the context's prefill is not timed;
//   - decode of 8 sequences at once after 128 tokens of context each: a context with 8
//     sequences, each step one token per sequence submitted together (node-llama-cpp batches
//     concurrent evaluations into one llama_decode), timed per step.
// Each measurement starts from a cleared KV cache (prefill) or erases what the previous
// repetition appended (decode), so every repetition really computes. Two times per row: the
// wall time seen from JavaScript (node-llama-cpp's batching, a greedy pick over the logits,
// promise round trips), and llama.cpp's own llama_decode time from its perf counters
// (performanceTracking; what llama-bench would report), the stricter peer.
// Check mode reads `prefixd-model generate ... --json --top-logprobs K` output and runs the
// same prompt through llama.cpp: free-running greedy ids (and the length of the prefix that
// agrees), and, teacher-forced on prefixd's ids so every step has the same context, the
// largest difference in log-probability over prefixd's top-K tokens at each step.
//
// Run it from a directory whose node_modules holds node-llama-cpp 3.22.1 (scripts/bench-peer
// installs one into .deps/llama-peer and copies this file there).
import fs from "node:fs";
import {getLlama, GgmlType, LlamaLogLevel} from "node-llama-cpp";

const kVocab = 50257;

function parseArgs(argv) {
    const a = {
        model: "", threads: 2, reps: 5, steps: 8, check: "", kv: "F16", fa: "auto", verbose: false
    };
    for (let i = 0; i < argv.length; i++) {
        const f = argv[i];
        if (f === "--threads") a.threads = Number(argv[++i]);
        else if (f === "--reps") a.reps = Number(argv[++i]);
        else if (f === "--steps") a.steps = Number(argv[++i]);
        else if (f === "--check") a.check = argv[++i];
        else if (f === "--kv") a.kv = argv[++i];
        else if (f === "--flash-attention") a.fa = argv[++i];
        else if (f === "--verbose") a.verbose = true;
        else if (!f.startsWith("--") && a.model === "") a.model = f;
        else throw new Error(`unknown argument ${f}`);
    }
    if (a.model === "" || !(a.threads > 0) || !(a.reps > 0) || !(a.steps > 0) ||
        !["F16", "F32"].includes(a.kv) || !["auto", "on", "off"].includes(a.fa))
        throw new Error("usage: peer_bench.mjs MODEL.gguf [--threads N] [--reps N] [--steps N] " +
            "[--kv F16|F32] [--flash-attention auto|on|off] [--check OURS.json] [--verbose]");
    return a;
}

// bench/cpu_backend_bench.cc's Tokens(n, seed): a 64-bit LCG, ids in [0, 50257).
function Tokens(n, seed) {
    const mask = (1n << 64n) - 1n;
    let x = BigInt(seed + 1);
    const t = [];
    for (let i = 0; i < n; i++) {
        x = (x * 6364136223846793005n + 1442695040888963407n) & mask;
        t.push(Number((x >> 33n) % BigInt(kVocab)));
    }
    return t;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;
const cpuNow = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
};

// Like cpu_backend_bench's Timing: best wall and best CPU time, each its own minimum.
class Timing {
    wall = Infinity;
    cpu = Infinity;
    add(w, c) {
        this.wall = Math.min(this.wall, w);
        this.cpu = Math.min(this.cpu, c);
    }
}

// The last token asks for the next token's logits (greedy pick), so llama.cpp computes the LM
// head for that one position, as prefixd's Forward(..., want_logits) does.
const withLastLogits = (tokens) => tokens.map((t, i) =>
    i + 1 < tokens.length ? t : [t, {generateNext: {token: true, options: {temperature: 0}}}]);

// llama.cpp's perf counters (llama_perf_context) since the last call, in seconds: prompt eval
// (multi-token batches) plus eval (single tokens). node-llama-cpp prints and resets them
// through its logger, which delivers lines asynchronously, so wait for them.
class PerfReader {
    lines = [];
    onLog(message) {
        if (message.includes("llama_perf_context_print")) this.lines.push(message);
    }
    async read(context) {
        this.lines = [];
        await context.printTimings();
        const done = () => this.lines.some((l) => / eval time /.test(l) && !/prompt/.test(l));
        for (let i = 0; i < 2000 && !done(); i++)
            await new Promise((resolve) => setTimeout(resolve, 1));
        let ms = 0;
        for (const l of this.lines) {
            const m = l.match(/eval time =\s*([0-9.]+) ms/);
            if (m) ms += Number(m[1]);
        }
        return ms / 1e3;
    }
}

// Like Timing, plus llama.cpp's own decode time.
class PeerTiming extends Timing {
    decode = Infinity;
    addDecode(d) {
        this.decode = Math.min(this.decode, d);
    }
}

async function prefill(seq, perf, n, reps) {
    const tokens = withLastLogits(Tokens(n, n));
    const best = new PeerTiming();
    for (let r = 0; r < reps; r++) {
        await seq.clearHistory();
        await perf.read(seq.context);
        const t0 = now(), c0 = cpuNow();
        await seq.controlledEvaluate(tokens);
        best.add(now() - t0, cpuNow() - c0);
        best.addDecode(await perf.read(seq.context));
    }
    return best;
}

// `n` sequences, each with `context` tokens (cpu_backend_bench's Tokens(.., 100 + s)), then
// `steps` steps of one token per sequence, submitted together so that llama.cpp decodes them
// as one batch.
async function decodeBatch(model, contextOptions, perf, n, context, steps, reps) {
    const ctx = await model.createContext({
        ...contextOptions, sequences: n,
        // Each sequence gets an equal share of the cells.
        contextSize: n * Math.ceil((context + steps) / 256) * 256
    });
    const seqs = Array.from({length: n}, () => ctx.getSequence());
    const tokens = seqs.map((_, s) => Tokens(context + steps, 100 + s));
    await Promise.all(seqs.map((seq, s) =>
        seq.evaluateWithoutGeneratingNewTokens(tokens[s].slice(0, context))));
    const best = new PeerTiming();
    for (let r = 0; r < reps; r++) {
        for (const seq of seqs) {
            if (seq.nextTokenIndex > context)
                await seq.eraseContextTokenRanges([{start: context, end: seq.nextTokenIndex}]);
        }
        await perf.read(ctx);
        const t0 = now(), c0 = cpuNow();
        for (let i = 0; i < steps; i++) {
            await Promise.all(seqs.map((seq, s) =>
                seq.controlledEvaluate(withLastLogits([tokens[s][context + i]]))));
        }
        best.add((now() - t0) / steps, (cpuNow() - c0) / steps);
        best.addDecode((await perf.read(ctx)) / steps);
    }
    await ctx.dispose();
    return best;
}

async function decode(seq, perf, context, steps, reps) {
    const tokens = Tokens(context + steps, 100);
    await seq.clearHistory();
    await seq.evaluateWithoutGeneratingNewTokens(tokens.slice(0, context));
    const best = new PeerTiming();
    for (let r = 0; r < reps; r++) {
        if (seq.nextTokenIndex > context)
            await seq.eraseContextTokenRanges([{start: context, end: seq.nextTokenIndex}]);
        await perf.read(seq.context);
        const t0 = now(), c0 = cpuNow();
        for (let i = 0; i < steps; i++)
            await seq.controlledEvaluate(withLastLogits([tokens[context + i]]));
        best.add((now() - t0) / steps, (cpuNow() - c0) / steps);
        best.addDecode((await perf.read(seq.context)) / steps);
    }
    return best;
}

// Log-softmax of a Map<token, logit> covering the vocabulary.
function logSoftmax(logits) {
    let max = -Infinity;
    for (const v of logits.values()) max = Math.max(max, v);
    let sum = 0;
    for (const v of logits.values()) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    return (t) => logits.get(t) - lse;
}

async function check(seq, ours) {
    const prompt = ours.prompt_ids, want = ours.generated_ids;
    // Free-running greedy decoding in llama.cpp.
    await seq.clearHistory();
    const got = [];
    let input = prompt;
    for (let i = 0; i < want.length; i++) {
        const out = await seq.controlledEvaluate(withLastLogits(input));
        const next = out[input.length - 1].next.token;
        got.push(next);
        input = [next];
    }
    let agree = 0;
    while (agree < want.length && got[agree] === want[agree]) agree++;
    // Teacher-forced on prefixd's ids: logits at every generated position in one evaluation.
    await seq.clearHistory();
    const forced = [...prompt, ...want.slice(0, -1)];
    const items = forced.map((t, i) => i < prompt.length - 1 ? t
        : [t, {generateNext: {token: true, logits: true, options: {temperature: 0}}}]);
    const out = await seq.controlledEvaluate(items);
    let maxDiff = 0, maxChosenDiff = 0, sumChosenDiff = 0, argmaxAgree = 0, maxAbsLogprob = 0;
    const steps = [];
    for (let i = 0; i < want.length; i++) {
        const next = out[prompt.length - 1 + i].next;
        const lp = logSoftmax(next.logits);
        const chosen = Math.abs(lp(want[i]) - ours.logprobs[i]);
        maxChosenDiff = Math.max(maxChosenDiff, chosen);
        sumChosenDiff += chosen;
        const top = ours.top_logprobs?.[i];
        if (top) top.token_ids.forEach((t, k) => {
            maxDiff = Math.max(maxDiff, Math.abs(lp(t) - top.logprobs[k]));
            maxAbsLogprob = Math.max(maxAbsLogprob, Math.abs(top.logprobs[k]));
        });
        if (next.token === want[i]) argmaxAgree++;
        steps.push({
            ours: want[i], llama: next.token, ours_logprob: ours.logprobs[i], llama_logprob: lp(want[i])
        });
    }
    return {prompt_len: prompt.length, ours: want, llama: got, agreeing_prefix: agree,
        teacher_forced_argmax_agree: argmaxAgree, max_abs_dlogprob_chosen: maxChosenDiff,
        mean_abs_dlogprob_chosen: sumChosenDiff / Math.max(1, want.length),
        max_abs_dlogprob_topk: maxDiff, topk: ours.top_logprobs?.[0]?.token_ids.length ?? 0,
        max_abs_logprob_topk: maxAbsLogprob, steps};
}

async function main() {
    const args = parseArgs(process.argv.slice(2));
    const logs = [];
    const perf = new PerfReader();
    // Debug level while loading (the CPU variant is named at "log" level); info level after,
    // since llama.cpp's debug lines during evaluation would cost time in the logger.
    const llama = await getLlama({
        gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
        maxThreads: args.threads, logLevel: LlamaLogLevel.debug,
        logger: (level, message) => {
            if (/load_backend|Flash Attention/.test(message)) logs.push(message);
            perf.onLog(message);
            if (args.verbose)
                process.stderr.write(`[llama.cpp ${level}] ${message.replace(/\n$/, "")}\n`);
        }
    });
    const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0});
    // 1,024 positions (GPT-2's) hold the 512-token prompt and decode at context 256 + steps.
    const contextOptions = {
        batchSize: 512, threads: {ideal: args.threads, min: args.threads},
        performanceTracking: true,
        // llama.cpp's defaults (F16 KV cache, flash attention when supported) are what the speed
        // runs use; the correctness check uses F32 and no flash attention, whose CPU kernel
        // rounds more (max |dlogprob| 5e-3 instead of 1e-3 on the tiny random model).
        experimentalKvCacheKeyType: args.kv, experimentalKvCacheValueType: args.kv,
        flashAttention: args.fa === "auto" ? "auto" : args.fa === "on"
    };
    const context = await model.createContext({
        ...contextOptions, contextSize: Math.min(1024, model.trainContextSize), sequences: 1
    });
    const seq = context.getSequence();
    if (!args.verbose) llama.logLevel = LlamaLogLevel.info;
    await new Promise((resolve) => setTimeout(resolve, 50));  // let queued log lines arrive
    const logText = logs.join("\n");
    const variant = logText.match(/libggml-cpu-([a-z0-9_]+)\.so/)?.[1] ?? "unknown";
    const info = {
        llama_cpp_release: llama.llamaCppRelease.release, cpu_variant: variant,
        threads: context.idealThreads, batch_size: context.batchSize,
        context_size: context.contextSize,
        // "auto" resolves inside llama.cpp, which logs the outcome.
        flash_attention: logText.match(/Flash Attention (enabled|disabled)/i)?.[1] ??
            String(context.flashAttention),
        kv_cache_type: GgmlType[context.kvCacheKeyType] ?? String(context.kvCacheKeyType),
        system_info: llama.systemInfo.trim()
    };
    process.stderr.write(`peer_bench: llama.cpp ${info.llama_cpp_release}, ` +
        `CPU variant ${variant}, ` +
        `${info.threads} threads, batch ${info.batch_size}, context ${info.context_size}, ` +
        `flash attention ${info.flash_attention}, KV cache ${info.kv_cache_type}\n` +
        `peer_bench: ${info.system_info}\n`);

    if (args.check !== "") {
        const result = await check(seq, JSON.parse(fs.readFileSync(args.check, "utf8")));
        process.stdout.write(JSON.stringify({info, ...result}) + "\n");
    } else {
        console.log(`model ${args.model}, llama.cpp ${info.llama_cpp_release} (${variant}), ` +
            `${info.threads} threads, best of ${args.reps}\n`);
        console.log("| measurement | wall time (node) | CPU time (all threads) " +
            "| tokens/s (node wall) | llama_decode time | tokens/s (llama_decode) |\n" +
            "|---|---|---|---|---|---|");
        const ms = (s) => (s * 1e3).toFixed(1);
        for (const n of [17, 512]) {
            if (n > context.contextSize) continue;
            const t = await prefill(seq, perf, n, args.reps);
            console.log(`| prefill ${n} tokens | ${ms(t.wall)} ms | ${ms(t.cpu)} ms ` +
                `| ${(n / t.wall).toFixed(0)} | ${ms(t.decode)} ms ` +
                `| ${(n / t.decode).toFixed(0)} |`);
        }
        for (const ctx of [16, 256]) {
            if (ctx + args.steps > context.contextSize) continue;
            const t = await decode(seq, perf, ctx, args.steps, args.reps);
            console.log(`| decode batch 1, context ${ctx} | ${ms(t.wall)} ms/step ` +
                `| ${ms(t.cpu)} ms/step | ${(1 / t.wall).toFixed(1)} | ${ms(t.decode)} ms/step ` +
                `| ${(1 / t.decode).toFixed(1)} |`);
        }
        {
            const n = 8, ctx = 128;
            const t = await decodeBatch(model, contextOptions, perf, n, ctx, args.steps, args.reps);
            console.log(`| decode batch ${n}, context ${ctx} | ${ms(t.wall)} ms/step ` +
                `| ${ms(t.cpu)} ms/step | ${(n / t.wall).toFixed(1)} | ${ms(t.decode)} ms/step ` +
                `| ${(n / t.decode).toFixed(1)} |`);
        }
    }
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    process.stderr.write(`peer_bench: ${e.stack ?? e}\n`);
    process.exit(1);
});
