_mlx__bun() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="mlx__bun"
                ;;
            mlx__bun,bench)
                cmd="mlx__bun__subcmd__bench"
                ;;
            mlx__bun,cache-prompt)
                cmd="mlx__bun__subcmd__cache__subcmd__prompt"
                ;;
            mlx__bun,chat)
                cmd="mlx__bun__subcmd__chat"
                ;;
            mlx__bun,completions)
                cmd="mlx__bun__subcmd__completions"
                ;;
            mlx__bun,convert)
                cmd="mlx__bun__subcmd__convert"
                ;;
            mlx__bun,evals)
                cmd="mlx__bun__subcmd__evals"
                ;;
            mlx__bun,evaluate)
                cmd="mlx__bun__subcmd__evaluate"
                ;;
            mlx__bun,fit)
                cmd="mlx__bun__subcmd__fit"
                ;;
            mlx__bun,generate)
                cmd="mlx__bun__subcmd__generate"
                ;;
            mlx__bun,help)
                cmd="mlx__bun__subcmd__help"
                ;;
            mlx__bun,launch)
                cmd="mlx__bun__subcmd__launch"
                ;;
            mlx__bun,manage)
                cmd="mlx__bun__subcmd__manage"
                ;;
            mlx__bun,perplexity)
                cmd="mlx__bun__subcmd__perplexity"
                ;;
            mlx__bun,serve)
                cmd="mlx__bun__subcmd__serve"
                ;;
            mlx__bun,train)
                cmd="mlx__bun__subcmd__train"
                ;;
            mlx__bun,upload)
                cmd="mlx__bun__subcmd__upload"
                ;;
            mlx__bun__subcmd__bench,attention)
                cmd="mlx__bun__subcmd__bench__subcmd__attention"
                ;;
            mlx__bun__subcmd__bench,feature-matrix)
                cmd="mlx__bun__subcmd__bench__subcmd__feature__subcmd__matrix"
                ;;
            mlx__bun__subcmd__bench,forward)
                cmd="mlx__bun__subcmd__bench__subcmd__forward"
                ;;
            mlx__bun__subcmd__bench,generate)
                cmd="mlx__bun__subcmd__bench__subcmd__generate"
                ;;
            mlx__bun__subcmd__bench,help)
                cmd="mlx__bun__subcmd__bench__subcmd__help"
                ;;
            mlx__bun__subcmd__bench,qmv)
                cmd="mlx__bun__subcmd__bench__subcmd__qmv"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,attention)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__attention"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,feature-matrix)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__feature__subcmd__matrix"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,forward)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__forward"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,generate)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__generate"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,help)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__help"
                ;;
            mlx__bun__subcmd__bench__subcmd__help,qmv)
                cmd="mlx__bun__subcmd__bench__subcmd__help__subcmd__qmv"
                ;;
            mlx__bun__subcmd__evals,compare)
                cmd="mlx__bun__subcmd__evals__subcmd__compare"
                ;;
            mlx__bun__subcmd__evals,help)
                cmd="mlx__bun__subcmd__evals__subcmd__help"
                ;;
            mlx__bun__subcmd__evals,import)
                cmd="mlx__bun__subcmd__evals__subcmd__import"
                ;;
            mlx__bun__subcmd__evals,list)
                cmd="mlx__bun__subcmd__evals__subcmd__list"
                ;;
            mlx__bun__subcmd__evals,report)
                cmd="mlx__bun__subcmd__evals__subcmd__report"
                ;;
            mlx__bun__subcmd__evals,show)
                cmd="mlx__bun__subcmd__evals__subcmd__show"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,compare)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__compare"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,help)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__help"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,import)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__import"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,list)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__list"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,report)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__report"
                ;;
            mlx__bun__subcmd__evals__subcmd__help,show)
                cmd="mlx__bun__subcmd__evals__subcmd__help__subcmd__show"
                ;;
            mlx__bun__subcmd__help,bench)
                cmd="mlx__bun__subcmd__help__subcmd__bench"
                ;;
            mlx__bun__subcmd__help,cache-prompt)
                cmd="mlx__bun__subcmd__help__subcmd__cache__subcmd__prompt"
                ;;
            mlx__bun__subcmd__help,chat)
                cmd="mlx__bun__subcmd__help__subcmd__chat"
                ;;
            mlx__bun__subcmd__help,completions)
                cmd="mlx__bun__subcmd__help__subcmd__completions"
                ;;
            mlx__bun__subcmd__help,convert)
                cmd="mlx__bun__subcmd__help__subcmd__convert"
                ;;
            mlx__bun__subcmd__help,evals)
                cmd="mlx__bun__subcmd__help__subcmd__evals"
                ;;
            mlx__bun__subcmd__help,evaluate)
                cmd="mlx__bun__subcmd__help__subcmd__evaluate"
                ;;
            mlx__bun__subcmd__help,fit)
                cmd="mlx__bun__subcmd__help__subcmd__fit"
                ;;
            mlx__bun__subcmd__help,generate)
                cmd="mlx__bun__subcmd__help__subcmd__generate"
                ;;
            mlx__bun__subcmd__help,help)
                cmd="mlx__bun__subcmd__help__subcmd__help"
                ;;
            mlx__bun__subcmd__help,launch)
                cmd="mlx__bun__subcmd__help__subcmd__launch"
                ;;
            mlx__bun__subcmd__help,manage)
                cmd="mlx__bun__subcmd__help__subcmd__manage"
                ;;
            mlx__bun__subcmd__help,perplexity)
                cmd="mlx__bun__subcmd__help__subcmd__perplexity"
                ;;
            mlx__bun__subcmd__help,serve)
                cmd="mlx__bun__subcmd__help__subcmd__serve"
                ;;
            mlx__bun__subcmd__help,train)
                cmd="mlx__bun__subcmd__help__subcmd__train"
                ;;
            mlx__bun__subcmd__help,upload)
                cmd="mlx__bun__subcmd__help__subcmd__upload"
                ;;
            mlx__bun__subcmd__help__subcmd__bench,attention)
                cmd="mlx__bun__subcmd__help__subcmd__bench__subcmd__attention"
                ;;
            mlx__bun__subcmd__help__subcmd__bench,feature-matrix)
                cmd="mlx__bun__subcmd__help__subcmd__bench__subcmd__feature__subcmd__matrix"
                ;;
            mlx__bun__subcmd__help__subcmd__bench,forward)
                cmd="mlx__bun__subcmd__help__subcmd__bench__subcmd__forward"
                ;;
            mlx__bun__subcmd__help__subcmd__bench,generate)
                cmd="mlx__bun__subcmd__help__subcmd__bench__subcmd__generate"
                ;;
            mlx__bun__subcmd__help__subcmd__bench,qmv)
                cmd="mlx__bun__subcmd__help__subcmd__bench__subcmd__qmv"
                ;;
            mlx__bun__subcmd__help__subcmd__evals,compare)
                cmd="mlx__bun__subcmd__help__subcmd__evals__subcmd__compare"
                ;;
            mlx__bun__subcmd__help__subcmd__evals,import)
                cmd="mlx__bun__subcmd__help__subcmd__evals__subcmd__import"
                ;;
            mlx__bun__subcmd__help__subcmd__evals,list)
                cmd="mlx__bun__subcmd__help__subcmd__evals__subcmd__list"
                ;;
            mlx__bun__subcmd__help__subcmd__evals,report)
                cmd="mlx__bun__subcmd__help__subcmd__evals__subcmd__report"
                ;;
            mlx__bun__subcmd__help__subcmd__evals,show)
                cmd="mlx__bun__subcmd__help__subcmd__evals__subcmd__show"
                ;;
            mlx__bun__subcmd__help__subcmd__train,fuse)
                cmd="mlx__bun__subcmd__help__subcmd__train__subcmd__fuse"
                ;;
            mlx__bun__subcmd__train,fuse)
                cmd="mlx__bun__subcmd__train__subcmd__fuse"
                ;;
            mlx__bun__subcmd__train,help)
                cmd="mlx__bun__subcmd__train__subcmd__help"
                ;;
            mlx__bun__subcmd__train__subcmd__help,fuse)
                cmd="mlx__bun__subcmd__train__subcmd__help__subcmd__fuse"
                ;;
            mlx__bun__subcmd__train__subcmd__help,help)
                cmd="mlx__bun__subcmd__train__subcmd__help__subcmd__help"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        mlx__bun)
            opts="-h -V --help --version generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench)
            opts="-h --help feature-matrix generate qmv attention forward help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__attention)
            opts="-h --heads --context --dtype --batch --runs --json --check --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --heads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --runs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__feature__subcmd__matrix)
            opts="-m -h --model --draft-model --cells --smoke --workloads --rounds --out --db --ready-timeout --json --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cells)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --workloads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rounds)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --out)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ready-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__forward)
            opts="-m -h --model --compute-dtype --synthetic --q-bits --q-group-size --dtype --compare-kernel --lengths --context --runs --decode --json --no-db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --synthetic)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --q-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --q-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lengths)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --runs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --decode)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__generate)
            opts="-m -p -g -n -h --model --compute-dtype --prompt-tokens --generation-tokens --num-trials --prefill-step-size --json --no-db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --generation-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -g)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-trials)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help)
            opts="feature-matrix generate qmv attention forward help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__attention)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__feature__subcmd__matrix)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__forward)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__generate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__help__subcmd__qmv)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__bench__subcmd__qmv)
            opts="-h --shapes --rows --bits --group-size --dtype --batch --runs --peak-gbps --json --glu --check --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --shapes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rows)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --runs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --peak-gbps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__cache__subcmd__prompt)
            opts="-m -p -h --model --compute-dtype --prompt --prompt-file --messages-file --prompt-cache-file --max-kv-size --kv-bits --kv-group-size --quantized-kv-start --prefill-step-size --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --messages-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-kv-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantized-kv-start)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__chat)
            opts="-m -n -h --model --compute-dtype --system --max-tokens --temp --top-p --top-k --min-p --min-tokens-to-keep --xtc-probability --xtc-threshold --repetition-penalty --seed --max-kv-size --kv-bits --kv-group-size --quantized-kv-start --prompt-cache-file --prefill-step-size --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --system)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-tokens-to-keep)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-probability)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repetition-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-kv-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantized-kv-start)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__completions)
            opts="-h --help bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__convert)
            opts="-m -o -d -q -h --model --hf-path --gguf --output --mlx-path --dtype --dequantize --quantize --q-bits --q-group-size --q-mode --quant-predicate --upload-repo --target-bpw --low-bits --low-group-size --high-bits --high-group-size --data --sensitivities --save-sensitivities --seed --sequence-length --num-samples --batch-size --accumulation-dtype --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --hf-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --gguf)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mlx-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --q-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --q-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --q-mode)
                    COMPREPLY=($(compgen -W "affine mxfp4 nvfp4 mxfp8" -- "${cur}"))
                    return 0
                    ;;
                --quant-predicate)
                    COMPREPLY=($(compgen -W "mixed_2_6 mixed_3_4 mixed_3_6 mixed_4_6" -- "${cur}"))
                    return 0
                    ;;
                --upload-repo)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --target-bpw)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --low-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --low-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --high-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --high-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --data)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sensitivities)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --save-sensitivities)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequence-length)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --accumulation-dtype)
                    COMPREPLY=($(compgen -W "float32 bfloat16" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals)
            opts="-h --db --help list show compare import report help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__compare)
            opts="-h --k --threshold --check --json --db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help)
            opts="list show compare import report help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__compare)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__import)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__report)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__help__subcmd__show)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__import)
            opts="-h --kind --label --model --flags --logs --note --db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --kind)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --label)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --flags)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --logs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --note)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__list)
            opts="-h --kind --limit --json --db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --kind)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__report)
            opts="-h --db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evals__subcmd__show)
            opts="-h --json --db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__evaluate)
            opts="-m -h --model --compute-dtype --tasks --task-dir --num-shots --seed --limit --max-tokens --batch-size --json --db --no-db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tasks)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --task-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-shots)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__fit)
            opts="-m -h --model --draft-model --num-draft-tokens --context --batch --kv-bits --memory --prefill-step-size --json --compute-dtype --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -W "2 3 4 5 6 8" -- "${cur}"))
                    return 0
                    ;;
                --memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__generate)
            opts="-m -p -n -v -h --model --prompt --batch-file --decode-concurrency --prompt-concurrency --prompt-file --messages-file --system --ignore-chat-template --max-tokens --temp --top-p --top-k --min-p --min-tokens-to-keep --xtc-probability --xtc-threshold --compute-dtype --repetition-penalty --repetition-context-size --logit-bias --seed --stop --json --verbose --prefill-step-size --draft-model --num-draft-tokens --adapter-path --json-schema --json-object --regex --choice --grammar --prompt-cache-file --max-kv-size --kv-bits --kv-group-size --quantized-kv-start --pipeline --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --decode-concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --messages-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --system)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-tokens-to-keep)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-probability)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repetition-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repetition-context-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --logit-bias)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stop)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --adapter-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --json-schema)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --regex)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --choice)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grammar)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-kv-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantized-kv-start)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help)
            opts="generate cache-prompt chat serve convert upload manage train bench evals fit evaluate perplexity completions launch help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench)
            opts="feature-matrix generate qmv attention forward"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench__subcmd__attention)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench__subcmd__feature__subcmd__matrix)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench__subcmd__forward)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench__subcmd__generate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__bench__subcmd__qmv)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__cache__subcmd__prompt)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__chat)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__convert)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals)
            opts="list show compare import report"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals__subcmd__compare)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals__subcmd__import)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals__subcmd__report)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evals__subcmd__show)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__evaluate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__fit)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__generate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__launch)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__manage)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__perplexity)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__train)
            opts="fuse"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__train__subcmd__fuse)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__help__subcmd__upload)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__launch)
            opts="-n -p -h --backend --hostfile --hosts --repeat-hosts --num-ranks --starting-port --nccl-port --env --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --backend)
                    COMPREPLY=($(compgen -W "ring nccl mpi" -- "${cur}"))
                    return 0
                    ;;
                --hosts)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --hostfile)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-ranks)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repeat-hosts)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --starting-port)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --nccl-port)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --env)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__manage)
            opts="-y -h --scan --delete --pattern --yes --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --delete)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pattern)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__perplexity)
            opts="-m -h --model --compute-dtype --data --data-path --sequence-length --num-samples --batch-size --seed --json --db --no-db --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --data-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --data)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequence-length)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__serve)
            opts="-m -h --model --compute-dtype --pipeline --host --port --api-key --max-tokens-default --prompt-cache --max-queue --max-body-bytes --log-level --adapter-path --draft-model --num-draft-tokens --decode-concurrency --prompt-concurrency --prefill-step-size --kv-budget --warmup --no-warmup --temp --top-p --top-k --min-p --min-tokens-to-keep --xtc-probability --xtc-threshold --allowed-origins --tool-call-parser --reasoning-parser --chat-template --chat-template-args --allowed-models --allow-any-model --model-memory --shutdown-grace --max-kv-size --kv-bits --kv-group-size --quantized-kv-start --ssd-cache --ssd-cache-max --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --host)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --port)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --api-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens-default)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-queue)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-body-bytes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --adapter-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --decode-concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefill-step-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-budget)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --warmup)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-tokens-to-keep)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-probability)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --xtc-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --allowed-origins)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tool-call-parser)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reasoning-parser)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --chat-template)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --chat-template-args)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --allowed-models)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --shutdown-grace)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-kv-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantized-kv-start)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ssd-cache)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ssd-cache-max)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__train)
            opts="-c -m -h --config --model --compute-dtype --data --method --mlx-path --adapter-path --resume-adapter-file --num-layers --lora-rank --lora-scale --lora-alpha --lora-dropout --lora-keys --batch-size --iters --learning-rate --optimizer --weight-decay --lr-schedule --warmup --warmup-init --min-lr --grad-accumulation-steps --grad-clip --grad-checkpoint --seed --mask-prompt --max-seq-length --steps-per-eval --val-batches --save-every --test --test-batches --orpo-lambda --sft-scope --loss-chunk-tokens --db --no-db --json --quantized-model --bits --group-size --num-samples --num-valid-samples --temperature --top-k --target-dir --targets-only --help fuse help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -c)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compute-dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --data)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --method)
                    COMPREPLY=($(compgen -W "sft lora orpo dwq" -- "${cur}"))
                    return 0
                    ;;
                --adapter-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mlx-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resume-adapter-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-layers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-rank)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-dropout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-keys)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --iters)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --learning-rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --optimizer)
                    COMPREPLY=($(compgen -W "adam adamw sgd" -- "${cur}"))
                    return 0
                    ;;
                --weight-decay)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lr-schedule)
                    COMPREPLY=($(compgen -W "constant cosine linear" -- "${cur}"))
                    return 0
                    ;;
                --warmup)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --warmup-init)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-lr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grad-accumulation-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grad-clip)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-seq-length)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --steps-per-eval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --val-batches)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --save-every)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --test-batches)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --orpo-lambda)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sft-scope)
                    COMPREPLY=($(compgen -W "full response" -- "${cur}"))
                    return 0
                    ;;
                --loss-chunk-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --db)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantized-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-valid-samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temperature)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --target-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__train__subcmd__fuse)
            opts="-m -o -h --model --adapter-path --save-path --output --dequantize --upload-repo --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --adapter-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --save-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --upload-repo)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__train__subcmd__help)
            opts="fuse help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__train__subcmd__help__subcmd__fuse)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__train__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        mlx__subcmd__bun__subcmd__upload)
            opts="-h --path --upload-repo --private --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --upload-repo)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _mlx__bun -o nosort -o bashdefault -o default mlx-bun
else
    complete -F _mlx__bun -o bashdefault -o default mlx-bun
fi
