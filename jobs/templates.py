"""Built-in job templates: starting points every project gets. Projects save their own as `JobTemplate` rows."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BuiltinTemplate:
    id: str
    name: str
    description: str
    script: str
    gpus: int  # on each node
    time_limit_minutes: int
    node_count: int = 1
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

MULTI_NODE_TRAINING = BuiltinTemplate(
    id="pytorch-multi-node-training",
    name="Multi-node training (PyTorch, torchrun)",
    description=(
        "Trains on several nodes at once: srun starts one torchrun per node, and the torchruns meet at the job's "
        "first node (the rendezvous), each starting one process per GPU. Choose nodes and GPUs per node, and "
        "switches 1 to keep the nodes under one network switch. Edit TRAIN_SCRIPT and the arguments."
    ),
    gpus=4,
    node_count=2,
    time_limit_minutes=30,
    environment={"TRAIN_SCRIPT": "train.py", "EPOCHS": "10", "OMP_NUM_THREADS": "4", "MASTER_PORT": "29500"},
    script="""#!/bin/bash
# One torchrun per node, started by srun; they meet at the first node of the job (the rendezvous).
set -euo pipefail
# The job gets the portal's variables only: srun's tasks find their programs through this PATH.
export PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"
mapfile -t HOSTS < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
export MASTER_ADDR="${HOSTS[0]}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export NNODES="${SLURM_NNODES}"
export GPUS_PER_NODE="${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-1}}"
GPUS_PER_NODE="${GPUS_PER_NODE##*:}"  # a typed request reads "h100:4"
export WORLD_SIZE=$((NNODES * GPUS_PER_NODE))
echo "rendezvous ${MASTER_ADDR}:${MASTER_PORT}: ${NNODES} nodes (${HOSTS[*]})" \\
  "x ${GPUS_PER_NODE} GPUs = ${WORLD_SIZE} processes"
# What runs on each node: NODE_RANK is the node's place in the job (SLURM_NODEID).
launch='
export NODE_RANK="${SLURM_NODEID}"
echo "node ${SLURMD_NODENAME}: NODE_RANK=${NODE_RANK} of ${NNODES}," \\
  "MASTER_ADDR=${MASTER_ADDR}, MASTER_PORT=${MASTER_PORT}"
if command -v torchrun >/dev/null 2>&1; then
  exec torchrun --nnodes="${NNODES}" --nproc_per_node="${GPUS_PER_NODE}" --node_rank="${NODE_RANK}" \\
    --rdzv_id="${SLURM_JOB_ID}" --rdzv_backend=c10d --rdzv_endpoint="${MASTER_ADDR}:${MASTER_PORT}" \\
    "${TRAIN_SCRIPT}" --epochs "${EPOCHS}" --checkpoint-dir "${SLURM_SUBMIT_DIR}/checkpoints"
fi
echo "node ${SLURMD_NODENAME}: torchrun is not installed; would run ${GPUS_PER_NODE} processes of ${TRAIN_SCRIPT}"
'
srun --nodes="${NNODES}" --ntasks="${NNODES}" --ntasks-per-node=1 bash -c "${launch}"
echo "all ${NNODES} nodes done"
""",
)

BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {
    template.id: template
    for template in (GPU_SMOKE_TEST, PYTORCH_TRAINING, MULTI_NODE_TRAINING, PARAMETER_SWEEP, ARRAY_SWEEP)
}
