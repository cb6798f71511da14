"""The nanovllm course: fifteen short lessons that rebuild the engine's ideas one at a time.

Each lesson is a folder `NN_topic/` shipped inside the package (as data: a name that starts with a
digit is not an importable module, and the folders are loaded by path instead):

    README.md         the text: the goal, the idea, how nanovllm does it, then the exercise
    demo.py           the idea running live, with rich output (`run(console)`)
    exercise.py       the functions the learner writes: docstrings say exactly what, bodies raise
                      NotImplementedError
    hints.md          numbered hints, shown one at a time by `nanovllm lesson N --hint`
    test_exercise.py  hypothesis properties, each taking the implementation under test as `impl`
    reference.py      the same names as exercise.py, backed by the engine's own code: the reference
                      solution the properties must accept
    mutants.py        planted bugs: variants of the reference the properties must reject
    run.py            (lessons 01-10, 13-15) how `--run` plugs the learner's code into the real
                      engine, with which engine options and workload, what it compares besides
                      the completions (`COMPARE`), and the `--viz` moment

Because every property receives the implementation as a parameter, the *same* properties check
three things: the learner's copy of exercise.py (`nanovllm lesson N --check`), the engine
(CI: reference passes, on fresh random examples), and the planted bugs (CI: every one is caught,
`nanovllm lesson --mutants`). CI also checks that each untouched exercise fails, so no exercise
is solved already or untestable.

Package modules (importable):

    catalog        finds the lessons, reads their titles, loads their files by path
    workspace      the learner's copies, their saved failures and progress, outside the package
                   (`$NANOVLLM_HOME`); `--reset`; lessons that start from an earlier one
    harness        runs a lesson's properties in-process against any implementation
    report         `--check`: the learner's file against the properties, the short report
    watch          `--watch`: check again on every save
    testing        what test_exercise.py and mutants.py files share: settings, `Mutant`, `variant`
    strategies     hypothesis strategies and oracles several lessons share
    pytest_plugin  the `impl` fixture and the `--lesson-impl` option, for `--check --full`
    sim            the scheduler's and the model runner's simplified view (lessons 06, 07, 09)
    scripts        operation scripts for the block allocator and their driver (lesson 12)
    plug           a learner's component as a part the engine is built from (`EngineParts`,
                   `--run`), checked answer by answer
    plug_tensor_parallel  lesson 14's `--run`: the learner's sharding in every rank's process,
                   before the model is built
    workload       the requests `--run` and `--viz` send
    your_engine    `--run`: the learner's engine against the stock one, token for token
    compare        `--run`: the two runs' steps from their events, and the first step where the
                   learner's engine decided otherwise, in words
    moments        where each lesson's idea shows in a run's events (`--viz`)
    viz_adapter    the lessons' one way into the visualizer: its command line
    demo_support   helpers for the demos: a console, a small model, a quick engine
    cli            `nanovllm lesson ...`

Counting planted bugs: 136 across the fifteen lessons' `mutants.py` (`nanovllm lesson --mutants`),
and lesson 12 plants 7 more in the engine's structures for the learner's own properties to catch.
"""
