"""Two-number arithmetic with TRL-shaped reward functions: a task module
(`examples.arithmetic.task`), a dataset its script writes (`arithmetic.jsonl`, from
`python -m examples.arithmetic.make_data`) and a launch file (`run.yaml`)."""
