"""Built-in job templates: starting points every project gets. Projects save their own as `JobTemplate` rows."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BuiltinTemplate:
    id: str
    name: str
    description: str
    script: str
    gpus: int
    time_limit_minutes: int
    gpu_type: str = ""
    partition: str = ""
    cpus: int | None = None
    memory_gb: int | None = None
    environment: dict[str, str] = field(default_factory=dict)
    array: str = ""  # a job array's indexes; "": plain jobs


GPU_SMOKE_TEST = BuiltinTemplate(
    id="gpu-smoke-test",
    name="GPU smoke test",
    description="Prints the GPUs Slurm gave the job and the node it ran on. Takes a few seconds.",
    gpus=1,
    time_limit_minutes=5,
    script="""#!/bin/bash
# A quick check that the job starts and sees its GPUs.
echo "job ${SLURM_JOB_ID} on $(hostname) at $(date -u +%FT%TZ)"
echo "GPUs given to this job: ${CUDA_VISIBLE_DEVICES:-${SLURM_JOB_GPUS:-none}}"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
for step in 1 2 3; do echo "step ${step}/3"; sleep 1; done
echo "smoke test passed"
""",
)

PYTORCH_TRAINING = BuiltinTemplate(
    id="pytorch-multi-gpu-training",
    name="Multi-GPU training (PyTorch, one node)",
    description=(
        "Starts one training process per GPU with torchrun on a single node. Edit TRAIN_SCRIPT and the "
        "arguments; checkpoints go to the job's directory."
    ),
    gpus=4,
    time_limit_minutes=240,
    cpus=16,
    memory_gb=64,
    environment={"TRAIN_SCRIPT": "train.py", "EPOCHS": "10", "OMP_NUM_THREADS": "4"},
    script="""#!/bin/bash
# One process per GPU on this node; torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for each.
set -euo pipefail
GPUS=$(echo "${CUDA_VISIBLE_DEVICES:-0}" | tr ',' '\\n' | wc -l)
echo "training on ${GPUS} GPU(s) of $(hostname), ${EPOCHS} epochs"
if command -v torchrun >/dev/null 2>&1; then
  torchrun --standalone --nproc_per_node="${GPUS}" "${TRAIN_SCRIPT}" --epochs "${EPOCHS}" \\
    --checkpoint-dir "${SLURM_SUBMIT_DIR}/checkpoints"
else
  echo "torchrun is not installed on this node; showing the progress a run would print" >&2
  for epoch in $(seq 1 "${EPOCHS}"); do
    for pct in 25 50 75 100; do printf '\\repoch %s/%s [%-20s] %3s%%' "${epoch}" "${EPOCHS}" \\
      "$(printf '#%.0s' $(seq 1 $((pct / 5))))" "${pct}"; sleep 0.2; done
    echo
  done
fi
""",
)

PARAMETER_SWEEP = BuiltinTemplate(
    id="parameter-sweep",
    name="Parameter sweep",
    description=(
        "Runs one short experiment per value of LEARNING_RATES, one after another on the job's GPU, and "
        "prints a result line per value. Submit several with different values to run them in parallel."
    ),
    gpus=1,
    time_limit_minutes=60,
    environment={"LEARNING_RATES": "0.1 0.01 0.001"},
    script="""#!/bin/bash
# One run per learning rate; results are collected in the job's directory.
set -euo pipefail
for lr in ${LEARNING_RATES}; do
  echo "run lr=${lr} on GPU ${CUDA_VISIBLE_DEVICES:-?}"
  # Replace with your experiment, e.g.: python experiment.py --lr "${lr}"
  sleep 1
  echo "lr=${lr} loss=$(awk -v lr="${lr}" 'BEGIN { printf "%.4f", 1 / (1 + 100 * lr) }')" | tee -a results.txt
done
""",
)

ARRAY_SWEEP = BuiltinTemplate(
    id="array-sweep",
    name="Parameter sweep as a job array",
    description=(
        "One task per learning rate, as a job array: each task picks its value by SLURM_ARRAY_TASK_ID and writes "
        "its own log. At most 4 tasks run at once (the %4 of the array); change the array and LEARNING_RATES together."
    ),
    gpus=1,
    time_limit_minutes=60,
    array="0-7%4",
    environment={"LEARNING_RATES": "0.3 0.1 0.03 0.01 0.003 0.001 0.0003 0.0001"},
    script="""#!/bin/bash
# Task N of the array takes the N-th learning rate.
set -euo pipefail
read -r -a rates <<< "${LEARNING_RATES}"
lr="${rates[${SLURM_ARRAY_TASK_ID}]}"
echo "task ${SLURM_ARRAY_TASK_ID} of array ${SLURM_ARRAY_JOB_ID}: lr=${lr} on GPU ${CUDA_VISIBLE_DEVICES:-?}"
# Replace with your experiment, e.g.: python experiment.py --lr "${lr}"
sleep 1
echo "lr=${lr} loss=$(awk -v lr="${lr}" 'BEGIN { printf "%.4f", 1 / (1 + 100 * lr) }')"
""",
)

BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {
    template.id: template for template in (GPU_SMOKE_TEST, PYTORCH_TRAINING, PARAMETER_SWEEP, ARRAY_SWEEP)
}
