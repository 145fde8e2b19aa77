# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_mlx_bun_global_optspecs
    string join \n h/help V/version
end

function __fish_mlx_bun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_mlx_bun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_mlx_bun_using_subcommand
    set -l cmd (__fish_mlx_bun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -s V -l version -d 'Print version'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "generate" -d 'Generate text from a prompt or a chat'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "cache-prompt" -d 'Prefill a prompt and save its KV cache to a file (as mlx_lm.cache_prompt)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "chat" -d 'Chat interactively, keeping the KV cache across turns (as mlx_lm.chat)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "serve" -d 'Serve an OpenAI-compatible HTTP API'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "convert" -d 'Convert a Hugging Face checkpoint or a GGUF file into an mlx-lm model directory'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "upload" -d 'Upload a model folder to a Hugging Face Hub repo (as mlx_lm.upload)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "manage" -d 'List or delete models in the Hugging Face Hub cache (as mlx_lm.manage)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "train" -d 'Fine-tune with LoRA (SFT) or ORPO preference training'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "bench" -d 'Micro-benchmarks of the engine'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "evals" -d 'List, show and compare recorded runs (bench, train, ...)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "fit" -d 'Predict memory use and the largest context and batch that fit'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "evaluate" -d 'Score lm-evaluation-harness tasks (multiple choice, wikitext, gsm8k) as mlx_lm.evaluate'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "perplexity" -d 'Perplexity of a model on text (as mlx_lm.perplexity)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "completions" -d 'Print shell completions'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "launch" -d 'Run a subcommand on several ranks (MLX distributed: ring, nccl, mpi)'
complete -c mlx-bun -n "__fish_mlx_bun_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -s p -l prompt -d 'Prompt text; `-` reads standard input' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l batch-file -d 'Run every line of a JSONL file (a prompt string, a messages array, or an object with "prompt"/"messages" and per-line "max_tokens", "temperature", "seed", "stop", "json_schema"…) as one continuous batch; results print in input order (one JSON object per line with --json)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l decode-concurrency -d 'With --batch-file: rows decoded together' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l prompt-concurrency -d 'With --batch-file: prompts prefilled at once' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l prompt-file -d 'Read the prompt text from a file' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l messages-file -d 'An OpenAI-style JSON array of chat messages' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l system -d 'System message put before the prompt' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -s n -l max-tokens -d 'Maximum number of tokens to generate' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l temp -d 'Sampling temperature; 0 is greedy (serve: for requests that give none)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l top-p -d 'Nucleus sampling: keep the smallest set of tokens whose probability reaches this (1 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l top-k -d 'Keep the k most likely tokens; 0 is off' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l min-p -d 'Drop tokens below this fraction of the most likely one\'s probability' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l min-tokens-to-keep -d 'With --min-p: tokens that always survive the filter' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l xtc-probability -d 'XTC: the chance that a step removes its top choices (0 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l xtc-threshold -d 'XTC: the probability a token needs to count as a top choice' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l repetition-penalty -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l repetition-context-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l logit-bias -d 'Logit bias as JSON, e.g. \'{"1234": -100}\'' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l seed -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l stop -d 'Stop when this text appears (repeatable)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l prefill-step-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l draft-model -d 'Draft model for speculative decoding (a directory, a repo id, or `ngram` for prompt-lookup drafting without a model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l num-draft-tokens -d 'Tokens the draft proposes per verification step' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l adapter-path -d 'LoRA adapter directory (adapters.safetensors + adapter_config.json)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l json-schema -d 'Constrain the output to a JSON schema (a file or inline JSON)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l regex -d 'Constrain the output to a regular expression' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l choice -d 'Constrain the output to one of these comma-separated choices' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l grammar -d 'Constrain the output to a Lark grammar file' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l prompt-cache-file -d 'Continue from a KV cache saved by `cache-prompt` (or mlx_lm.cache_prompt); the prompt is what follows the cached text' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l max-kv-size -d 'Bound the KV cache to this many positions (the first 4 are kept)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l kv-bits -d 'Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8; default: no quantization)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l kv-group-size -d 'Group size of KV quantization' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l quantized-kv-start -d 'Quantize once the cache holds this many positions' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l ignore-chat-template -d 'Use the prompt as is, without the chat template'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l json -d 'Print one JSON object with the text and statistics instead of streaming'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -s v -l verbose -d 'Print prompt/decode speed and peak memory to stderr'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l json-object -d 'Constrain the output to any JSON object'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -l pipeline -d 'Under `mlx-bun launch` with several ranks: split the layers across ranks (pipeline parallel) instead of the heads and MLP columns'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand generate" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -s p -l prompt -d 'The text to cache; `-` reads standard input' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l prompt-file -d 'Read the text to cache from a file' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l messages-file -d 'A JSON array of chat messages; the last one is left open' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l prompt-cache-file -d 'Where to save the cache (`.safetensors` is appended when missing)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l max-kv-size -d 'Bound the cache to this many positions (the first 4 are kept)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l kv-bits -d 'Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8; default: no quantization)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l kv-group-size -d 'Group size of KV quantization' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l quantized-kv-start -d 'Quantize once the cache holds this many positions' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -l prefill-step-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand cache-prompt" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l system -d 'System message for every turn' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -s n -l max-tokens -d 'Maximum tokens per reply' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l temp -d 'Sampling temperature; 0 is greedy (serve: for requests that give none)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l top-p -d 'Nucleus sampling: keep the smallest set of tokens whose probability reaches this (1 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l top-k -d 'Keep the k most likely tokens; 0 is off' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l min-p -d 'Drop tokens below this fraction of the most likely one\'s probability' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l min-tokens-to-keep -d 'With --min-p: tokens that always survive the filter' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l xtc-probability -d 'XTC: the chance that a step removes its top choices (0 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l xtc-threshold -d 'XTC: the probability a token needs to count as a top choice' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l repetition-penalty -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l seed -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l max-kv-size -d 'Bound the KV cache to this many positions (the first 4 are kept)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l kv-bits -d 'Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8; default: no quantization)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l kv-group-size -d 'Group size of KV quantization' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l quantized-kv-start -d 'Quantize once the cache holds this many positions' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l prompt-cache-file -d 'Start from a KV cache saved by `cache-prompt`: the first message completes the cached user turn' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -l prefill-step-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand chat" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l host -d 'Address to listen on; anything but loopback exposes the server to the network' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l port -d 'Port to listen on; 0 picks a free one (the ready line shows it)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l api-key -d 'Require `Authorization: Bearer <KEY>` on every route but /health' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l max-tokens-default -d 'max_tokens for requests that give none (cut to fit the context)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l prompt-cache -d 'RAM prompt cache size in GiB; 0 disables it' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l max-queue -d 'Requests that may wait while one runs; more get 503 with Retry-After' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l max-body-bytes -d 'Largest accepted request body in bytes; larger ones get 413' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l log-level -d 'Log level: error, warn, info, debug or trace' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l adapter-path -d 'LoRA adapter directory to apply to the model' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l draft-model -d 'Draft model for speculative decoding (a directory, a repo id, or `ngram` for prompt-lookup drafting without a model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l num-draft-tokens -d 'Tokens the drafter proposes per step' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l decode-concurrency -d 'Rows decoded together in one batch (continuous batching); 1 turns batching off. Drafting rows verify inside the batch' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l prompt-concurrency -d 'Prompts prefilled at once while the batch keeps decoding' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l prefill-step-size -d 'Prefill prompts in chunks of exactly this many tokens, as mlx_lm.server (default: chunks sized to take about half a second, so running rows keep streaming while a long prompt comes in)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l kv-budget -d 'KV cache budget in GiB for admitted requests (default: half the memory available after loading). Requests wait while the batch would exceed it; one that can never fit gets a 400' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l warmup -d 'What runs before /health reports ready: auto (full on a GPU, where MLX compiles kernels on first use; basic on the CPU), basic (one forward pass), full (every prefill size class, batch size and sampling path) or off' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l temp -d 'Sampling temperature; 0 is greedy (serve: for requests that give none)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l top-p -d 'Nucleus sampling: keep the smallest set of tokens whose probability reaches this (1 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l top-k -d 'Keep the k most likely tokens; 0 is off' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l min-p -d 'Drop tokens below this fraction of the most likely one\'s probability' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l min-tokens-to-keep -d 'With --min-p: tokens that always survive the filter' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l xtc-probability -d 'XTC: the chance that a step removes its top choices (0 is off)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l xtc-threshold -d 'XTC: the probability a token needs to count as a top choice' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l allowed-origins -d 'Browser origins that may call the API: `loopback` (localhost, 127.0.0.1, [::1], any port), `*`, or a comma-separated list' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l tool-call-parser -d 'Tool-call format to parse (json_tools, llama3, mistral, function_gemma, phi, harmony, gemma4, glm47, laguna, kimi_k2, kimi_k3, longcat, minicpm5, minimax_m2, muse_spark, pythonic, qwen3_coder); by default the one the chat template implies' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l reasoning-parser -d 'Reasoning markers to split off (think, longcat, gemma4, or none); by default the ones the vocabulary or the chat template has' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l chat-template -d 'A Jinja chat template file to use instead of the model\'s' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l chat-template-args -d 'Template variables for every request, as a JSON object, e.g. \'{"enable_thinking": false}\'; a request\'s chat_template_kwargs win' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l allowed-models -d 'Other models requests may name in `model`: a folder (each subfolder with a config.json, by folder name) or a glob of model folders (by path). Repeatable' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l model-memory -d 'GiB of weights the loaded models may hold together; the least recently used idle model is unloaded past it (default: half the memory available at start)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l shutdown-grace -d 'Seconds to let running requests finish after SIGINT/SIGTERM' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l max-kv-size -d 'Bound each request\'s KV cache to this many positions (the first 4 are kept). Requests then run one at a time (no batching)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l kv-bits -d 'Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8; default: no quantization)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l kv-group-size -d 'Group size of KV quantization' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l quantized-kv-start -d 'Quantize once the cache holds this many positions' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l ssd-cache -d 'Folder of the prompt cache\'s tier on disk: finished requests\' KV caches are written there and restored after a restart' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l ssd-cache-max -d 'Size cap of --ssd-cache in GiB (least recently used entries go first)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l pipeline -d 'Under `mlx-bun launch` with several ranks: split the layers across ranks (pipeline parallel) instead of the heads and MLP columns'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l no-warmup -d 'No warm-up: ready as soon as the model is loaded (same as --warmup off)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -l allow-any-model -d 'Requests may name any local model folder or cached Hub repo id'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand serve" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -s m -l hf-path -l model -d 'A Hugging Face model: a local folder (Hugging Face or mlx-lm layout) or a Hub repo id' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l gguf -d 'A GGUF file to convert (LLaMA architecture; Q4_0, Q4_1, Q8_0, F16, F32 tensors)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -s o -l mlx-path -l output -d 'The directory to create; it must not exist yet' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l dtype -d 'Dtype of the floating tensors: float32, bfloat16 or float16 (default: config.json\'s torch_dtype; float32 for GGUF)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l q-bits -d 'Bits per weight for -q (default: 4; 8 for mxfp8)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l q-group-size -d 'Weights per quantization group for -q (default: 64 affine, 32 mxfp4/mxfp8, 16 nvfp4)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l q-mode -d 'Quantization mode for -q' -r -f -a "affine\t''
mxfp4\t''
nvfp4\t''
mxfp8\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l quant-predicate -d 'Mixed-bit recipe for -q (more bits for some v_proj/down_proj layers and lm_head)' -r -f -a "mixed_2_6\t''
mixed_3_4\t''
mixed_3_6\t''
mixed_4_6\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l upload-repo -d 'Upload the result to this Hub repo (user/name) once converted' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l target-bpw -d 'Quantize each layer to --low-bits or --high-bits, by its sensitivity on calibration text, so that the model averages at most this many bits per weight' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l low-bits -d 'Bits of the less sensitive layers (--target-bpw)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l low-group-size -d 'Group size of the less sensitive layers (--target-bpw)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l high-bits -d 'Bits of the more sensitive layers (--target-bpw)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l high-group-size -d 'Group size of the more sensitive layers (--target-bpw)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l data -d 'Calibration text for --target-bpw: a text or JSONL file, or a folder of them (default: mlx-lm\'s ~/.cache/mlx-lm/calibration_v5.txt when present)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l sensitivities -d 'Read pre-computed sensitivities (mlx-lm\'s JSON list) instead of estimating them' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l save-sensitivities -d 'Where estimated sensitivities are saved (default: <model>_sensitivities.json in the current folder, as mlx-lm names it)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l seed -d 'Seed of the calibration rows\' shuffle' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l sequence-length -d 'Tokens per calibration row' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l num-samples -d 'Calibration rows to use (default: all of the text)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l batch-size -d 'Calibration rows per gradient batch' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -l accumulation-dtype -d 'Dtype the sensitivity gradients are summed in' -r -f -a "float32\t''
bfloat16\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -s d -l dequantize -d 'Store every quantized layer as a dense weight'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -s q -l quantize -d 'Quantize every linear layer and the embedding'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand convert" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand upload" -l path -d 'The model folder to upload' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand upload" -l upload-repo -d 'The Hub repo to upload to (user/name); created when missing' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand upload" -l private -d 'Create the repo as private'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand upload" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand manage" -l delete -d 'Delete the cached repos whose id contains this pattern (asks first)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand manage" -l pattern -d 'Repo ids must contain this (for --scan, and for --delete without a pattern)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand manage" -l scan -d 'List the cached repos whose id contains --pattern'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand manage" -s y -l yes -d 'Delete without asking'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand manage" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -s c -l config -d 'YAML file with training options (mlx-lm\'s `lora` config keys)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l data -d 'Directory with train.jsonl, valid.jsonl and optionally test.jsonl' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l method -d 'Training objective: sft (LoRA fine-tuning), orpo (preference pairs) or dwq (distill the quantization scales and biases of a quantized student from the full-precision --model)' -r -f -a "sft\t''
lora\t''
orpo\t''
dwq\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l adapter-path -l mlx-path -d 'Where adapters.safetensors and adapter_config.json are written (dwq: the student model folder)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l resume-adapter-file -d 'Start from these adapter weights' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l num-layers -d 'Adapt the last N blocks (-1: all). Default 16' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lora-rank -d 'LoRA rank. Default 8' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lora-scale -d 'LoRA scale (the update is scale·x·A·B). Default 20' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lora-alpha -d 'LoRA alpha; sets scale = alpha / rank' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lora-dropout -d 'Dropout on the adapter input' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lora-keys -d 'Layers to adapt, comma-separated, by mlx-lm\'s names (e.g. self_attn.q_proj,self_attn.v_proj; Phi-3: self_attn.qkv_proj; MoE experts: mlp.switch_mlp.gate_proj). Default: every linear layer of the block and every expert projection, as mlx-lm' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l batch-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l iters -d 'Training iterations' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l learning-rate -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l optimizer -d 'adam, adamw or sgd' -r -f -a "adam\t''
adamw\t''
sgd\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l weight-decay -d 'Weight decay of adamw / sgd' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l lr-schedule -d 'Learning-rate schedule after warmup: constant, cosine or linear (decays to --min-lr over the run)' -r -f -a "constant\t''
cosine\t''
linear\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l warmup -d 'Linear warmup steps' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l warmup-init -d 'Learning rate at the start of the warmup' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l min-lr -d 'Final learning rate of a cosine or linear schedule' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l grad-accumulation-steps -d 'Accumulate gradients over this many batches per update' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l grad-clip -d 'Clip the global gradient norm to this value' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l seed -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l max-seq-length -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l steps-per-eval -d 'Validate every N steps' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l val-batches -d 'Validation batches per evaluation (-1: the whole set)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l save-every -d 'Save a checkpoint every N steps' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l test-batches -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l orpo-lambda -d 'ORPO: weight λ of the odds-ratio term. Default 0.1' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l sft-scope -d 'ORPO: NLL over prompt+chosen (full, default) or the chosen response only' -r -f -a "full\t''
response\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l loss-chunk-tokens -d 'Token rows per output-head chunk in the loss' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l quantized-model -d 'dwq: an already quantized student (default: the teacher quantized with --bits and --group-size)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l bits -d 'dwq: bits per weight of the student' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l group-size -d 'dwq: quantization group size of the student' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l num-samples -d 'dwq: training documents to use. Default 2048' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l num-valid-samples -d 'dwq: held-out documents for validation. Default 32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l temperature -d 'dwq: temperature of the distillation KL. Default 2' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l top-k -d 'dwq: teacher logits kept per position. Default 1024' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l target-dir -d 'dwq: folder of the teacher\'s targets (computed there when missing)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l grad-checkpoint -d 'Recompute each adapted layer\'s activations in the backward pass'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l mask-prompt -d 'SFT: supervise only the completion (the last message)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l test -d 'Evaluate on test.jsonl after training'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l no-db -d 'Do not record the run in the eval database'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l json -d 'Print one JSON object per step (and per evaluation) on stdout'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -l targets-only -d 'dwq: compute the teacher\'s targets into --target-dir and stop'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -f -a "fuse" -d 'Merge an adapter into the base weights and write a new model directory'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and not __fish_seen_subcommand_from fuse help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -s m -l model -d 'Base model directory or Hugging Face repo id (default: the embedded model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -l adapter-path -d 'Adapter directory (adapters.safetensors + adapter_config.json)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -s o -l output -l save-path -d 'Where to write the fused model' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -l upload-repo -d 'Upload the fused model to this Hub repo (user/name)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -l dequantize -d 'Write dense weights (dequantize every quantized layer)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from fuse" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from help" -f -a "fuse" -d 'Merge an adapter into the base weights and write a new model directory'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand train; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "feature-matrix" -d 'Every serving feature combination against the real `mlx-bun serve`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "generate" -d 'Prompt and generation speed on a random prompt, as `mlx_lm.benchmark`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "qmv" -d 'mlx-bun\'s CUDA quantized matrix-vector kernel against MLX\'s, on random weights (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "attention" -d 'mlx-bun\'s CUDA decode attention kernel (RoPE, cache write and attention in one launch) against MLX\'s nodes for the step (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "forward" -d 'Time one forward pass over L new tokens after a fixed context'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and not __fish_seen_subcommand_from feature-matrix generate qmv attention forward help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l draft-model -d 'Draft model of the spec cells (default: the model itself)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l cells -d 'Only these cells (comma-separated names; default: all)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l workloads -d 'Only these workloads (comma-separated; default: all)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l rounds -d 'Runs of the whole cell list, interleaved; the summary gives each cell\'s median and range over them' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l out -d 'Folder for the markdown report and the PNG plot' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l ready-timeout -d 'Seconds to wait for a server to report ready' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l smoke -d 'A small version for CI: tiny token counts, one or two requests per cell'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -l json -d 'Print the results as JSON'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from feature-matrix" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -s m -l model -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -s p -l prompt-tokens -d 'Length of the prompt, in tokens' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -s g -l generation-tokens -d 'Tokens to generate (end-of-sequence does not stop them)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -s n -l num-trials -d 'Timed trials after the warm-up' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -l prefill-step-size -d 'Prompt tokens per prefill chunk' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -l json -d 'Print JSON lines instead of mlx-lm\'s: the prompt drawn, then one object per trial'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -l no-db -d 'Do not record the run in the eval database'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from generate" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l shapes -d 'Layer shapes as OUTxIN (Llama 3 8B\'s q/o, k/v, gate/up and down by default)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l rows -d 'Rows of activations (1 = single-sequence decode)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l bits -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l group-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l dtype -d 'Activation dtype: bfloat16 or float16 (float32 stays with MLX\'s kernel)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l batch -d 'Products per timed graph (one evaluation launches them all)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l runs -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l peak-gbps -d 'The GPU\'s memory bandwidth in GB/s (H200: 4800)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l json
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l glu -d 'Time the gated MLP\'s first half, `silu(x @ gate.T) * (x @ up.T)` with gate and up of each shape: one fused kernel against MLX\'s two products and three elementwise ops'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -l check -d 'Exit with an error when the kernel\'s output differs from MLX\'s by more than float tolerance (relative to the largest output)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from qmv" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l heads -d 'Heads as QUERYxKEY/VALUE:HEAD_DIM (Llama 3 8B\'s by default)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l context -d 'Positions already in the cache' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l dtype -d 'Activation dtype: bfloat16 or float16' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l batch -d 'Layers per timed graph (one evaluation launches them all)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l runs -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l json
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -l check -d 'Also check adjacent-pair RoPE and per-pair frequencies, and exit with an error where the kernel\'s output or cache write differs from MLX\'s beyond the tolerance'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from attention" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -s m -l model -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l synthetic -d 'Random weights of a known shape instead of a model folder: llama-8b, llama-1b or smollm2-135m' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l q-bits -d 'Bits of the synthetic model\'s quantized weights (0: unquantized)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l q-group-size -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l dtype -d 'The synthetic model\'s dtype: bfloat16, float16 or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l lengths -d 'Comma-separated numbers of new tokens per forward pass' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l context -d 'Context already in the cache' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l runs -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l decode -d 'Also decode this many tokens greedily, one step queued ahead as `generate` does, and report tokens per second and the host time per step (building the graph, handing it to MLX)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l compare-kernel -d 'Time every length with mlx-bun\'s CUDA kernel on and off (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l json -d 'Print JSON lines instead of a table'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -l no-db -d 'Do not record the run in the eval database'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from forward" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "feature-matrix" -d 'Every serving feature combination against the real `mlx-bun serve`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "generate" -d 'Prompt and generation speed on a random prompt, as `mlx_lm.benchmark`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "qmv" -d 'mlx-bun\'s CUDA quantized matrix-vector kernel against MLX\'s, on random weights (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "attention" -d 'mlx-bun\'s CUDA decode attention kernel (RoPE, cache write and attention in one launch) against MLX\'s nodes for the step (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "forward" -d 'Time one forward pass over L new tokens after a fixed context'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand bench; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "list" -d 'The newest runs, one line each'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "show" -d 'One run: provenance, flags and every metric'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "compare" -d 'Metric by metric, run B against baseline A; flags regressions'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "import" -d 'Record metric samples (JSON lines: name, value, unit, higher_is_better) as one run; prints its id'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "report" -d 'One run\'s metrics as Markdown tables: medians, spread, and mlx-bun\'s ratio to each other program'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and not __fish_seen_subcommand_from list show compare import report help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from list" -l kind -d 'Only runs of this kind (bench, sft, orpo, perplexity, evaluate, ...)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from list" -l limit -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from list" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from list" -l json
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from show" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from show" -l json
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -l k -d 'With repeated samples, a change must exceed K pooled standard deviations' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -l threshold -d '... and this relative change (alone it decides for single samples)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -l check -d 'Exit with status 1 when any metric regressed'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -l json
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from compare" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l kind -d 'The run\'s kind (peers, bench, ...)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l label -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l model -d 'The model measured (a folder is fingerprinted)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l flags -d 'The run\'s flags, as a JSON object' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l logs -d 'A folder of logs kept with the run (the end of each file)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l note -d 'A text file kept with the run (provenance: date, machine, command)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from import" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from report" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from report" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "list" -d 'The newest runs, one line each'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "show" -d 'One run: provenance, flags and every metric'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "compare" -d 'Metric by metric, run B against baseline A; flags regressions'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "import" -d 'Record metric samples (JSON lines: name, value, unit, higher_is_better) as one run; prints its id'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "report" -d 'One run\'s metrics as Markdown tables: medians, spread, and mlx-bun\'s ratio to each other program'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evals; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l draft-model -d 'Draft model for speculative decoding' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l num-draft-tokens -d 'Tokens the draft proposes per step' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l context -d 'Tokens of context per sequence (default: the model\'s maximum)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l batch -d 'Sequences decoded at once' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l kv-bits -d 'Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8)' -r -f -a "2\t''
3\t''
4\t''
5\t''
6\t''
8\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l memory -d 'Memory to fit into, in GiB (default: MemAvailable of this machine)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l prefill-step-size -d 'Prompt tokens per prefill chunk' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -l json -d 'Print the report as JSON'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand fit" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l tasks -d 'Tasks, comma-separated: arc_easy, arc_challenge, hellaswag, piqa, mmlu (multiple choice), wikitext (rolling log-likelihood), gsm8k (generation); each read from <task-dir>/<task>.jsonl, or TASK=FILE' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l task-dir -d 'Folder of the task files' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l num-shots -d 'Solved examples before each question, drawn from the task file as lm-evaluation-harness draws them (MMLU: the first others of its subject)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l seed -d 'Seed of the few-shot sampler (Python\'s `random.Random`, as mlx_lm.evaluate)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l limit -d 'Score at most this many items per task' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l max-tokens -d 'Most tokens generated per answer in generation tasks (gsm8k)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l batch-size -d 'Accepted for mlx-lm compatibility; log-likelihood requests are scored one continuation at a time on the shared context\'s cache' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l json -d 'Print the results as JSON (with every choice\'s log-likelihood)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -l no-db -d 'Do not record the run in the eval database'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand evaluate" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -s m -l model -d 'Model directory or Hugging Face repo id (default: the embedded model)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l compute-dtype -d 'The dtype the model computes in: auto (float32 on the CPU, where MLX is fast only in float32; the model\'s own dtype on a GPU), model (the dtype its weights are stored in, on every device, as mlx-lm computes) or float32' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l data-path -l data -d 'Data to score: a plain-text file (one document), a JSONL or parquet file (text, chat `messages` or `prompt`/`completion` rows), a folder of such files, or a Hugging Face dataset id' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l sequence-length -d 'Tokens per row' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l num-samples -d 'Rows to score (-1: every complete row of the data)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l batch-size -d 'Rows per forward pass' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l seed -d 'Seed of the document order (numpy\'s, as mlx_lm.perplexity)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l db -d 'Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db)' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l json -d 'Print the result as one JSON object'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -l no-db -d 'Do not record the run in the eval database'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand perplexity" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand completions" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -l backend -d 'Distributed backend: ring (TCP), nccl (CUDA GPUs) or mpi. Default: the host file\'s, else nccl on a GPU build, else ring' -r -f -a "ring\t''
nccl\t''
mpi\t''"
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -l hosts -l hostfile -d 'An `mlx.launch` host file (JSON list of {"ssh", "ips"}, or an object with "backend", "envs" and "hosts")' -r -F
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -s n -l num-ranks -l repeat-hosts -d 'Run N ranks on this machine' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -s p -l starting-port -d 'Ring backend: first port (one per rank and address). Default: free ports when every rank is local, else 32323' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -l nccl-port -d 'NCCL backend: the port rank 0 listens on' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -l env -d 'Extra NAME=VALUE environment for every rank (repeatable)' -r
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand launch" -s h -l help -d 'Print help'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "generate" -d 'Generate text from a prompt or a chat'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "cache-prompt" -d 'Prefill a prompt and save its KV cache to a file (as mlx_lm.cache_prompt)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "chat" -d 'Chat interactively, keeping the KV cache across turns (as mlx_lm.chat)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "serve" -d 'Serve an OpenAI-compatible HTTP API'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "convert" -d 'Convert a Hugging Face checkpoint or a GGUF file into an mlx-lm model directory'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "upload" -d 'Upload a model folder to a Hugging Face Hub repo (as mlx_lm.upload)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "manage" -d 'List or delete models in the Hugging Face Hub cache (as mlx_lm.manage)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "train" -d 'Fine-tune with LoRA (SFT) or ORPO preference training'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "bench" -d 'Micro-benchmarks of the engine'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "evals" -d 'List, show and compare recorded runs (bench, train, ...)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "fit" -d 'Predict memory use and the largest context and batch that fit'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "evaluate" -d 'Score lm-evaluation-harness tasks (multiple choice, wikitext, gsm8k) as mlx_lm.evaluate'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "perplexity" -d 'Perplexity of a model on text (as mlx_lm.perplexity)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "completions" -d 'Print shell completions'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "launch" -d 'Run a subcommand on several ranks (MLX distributed: ring, nccl, mpi)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and not __fish_seen_subcommand_from generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from train" -f -a "fuse" -d 'Merge an adapter into the base weights and write a new model directory'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from bench" -f -a "feature-matrix" -d 'Every serving feature combination against the real `mlx-bun serve`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from bench" -f -a "generate" -d 'Prompt and generation speed on a random prompt, as `mlx_lm.benchmark`'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from bench" -f -a "qmv" -d 'mlx-bun\'s CUDA quantized matrix-vector kernel against MLX\'s, on random weights (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from bench" -f -a "attention" -d 'mlx-bun\'s CUDA decode attention kernel (RoPE, cache write and attention in one launch) against MLX\'s nodes for the step (GPU)'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from bench" -f -a "forward" -d 'Time one forward pass over L new tokens after a fixed context'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from evals" -f -a "list" -d 'The newest runs, one line each'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from evals" -f -a "show" -d 'One run: provenance, flags and every metric'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from evals" -f -a "compare" -d 'Metric by metric, run B against baseline A; flags regressions'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from evals" -f -a "import" -d 'Record metric samples (JSON lines: name, value, unit, higher_is_better) as one run; prints its id'
complete -c mlx-bun -n "__fish_mlx_bun_using_subcommand help; and __fish_seen_subcommand_from evals" -f -a "report" -d 'One run\'s metrics as Markdown tables: medians, spread, and mlx-bun\'s ratio to each other program'
