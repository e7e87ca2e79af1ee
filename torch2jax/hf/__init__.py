"""Everything that knows transformers (torch side), in the order a conversion meets it:

    options.py     GenerationOptions: what a generator is converted with (torch-free)
    source.py      HFSource: the directory or model object resolved once (config, task, tokenizer files), then loaded
    directory.py   transformers offline: a directory's config, models loaded (sdpa, else eager), files that travel
    streamed.py    a model built with fake params, its weights mapped from the safetensors files
                   (checkpoint_rules.py: transformers' own renaming and fusing rules)
    tasks.py       the task names, the default task of a config, the forward-pass tasks and their example inputs
    convert.py     convert_hf and the one dispatch, by task, to a step converter
    steps/         the step converters (causal LM, encoder-decoder, vision-language) over one KV-cache layout
    stand_ins/     trace-time stand-ins for transformers code torch.export cannot capture as written
    verify.py      generation checked against transformers' own generate; verify_slice.py: a streamed model's slice

Importing this package imports neither torch nor transformers; its modules do. `capture/` never imports it; it may
import `capture/`, `diagnose/` and the torch-free side (`generate/`, `runtime/`, ...).
"""
