"""One task of Distributed TensorFlow's parameter-server training (the RALP paper's baseline), run by path.

``python tf_ps.py ps --task I --ps A:P,... --workers A:P,... [options]`` serves PS task I until stopped;
``python tf_ps.py worker --task I ...`` builds worker I's graph (between-graph replication, as
tensorflow/benchmarks' tf_cnn_benchmarks drives the runtime), trains ``--warmup`` + ``--steps``
synchronous steps on a fixed synthetic batch and prints one JSON line: the measured steps' times,
losses and its host link's byte counters at the window's edges (read between two barriers).

TensorFlow's own runtime does everything: ``tf.distribute.Server`` per task, gRPC between tasks,
``tf.train.replica_device_setter`` (round robin) placing variables on the PS tasks. Two variable
updates, as tf_cnn_benchmarks defines them:

- ``parameter_server``: the model reads its variables from the PS tasks; each worker applies its
  own gradient on the PS task that holds the variable (N applies per variable per step), then a
  step-end barrier holds every worker until all have applied.
- ``distributed_replicated``: each worker computes on a local copy of the variables; per variable
  it applies its gradient to the PS copy, waits at that variable's barrier for every worker's
  apply, then reads the PS copy back into its local one.

The barriers are FIFO queues shared by name on the PS tasks (each worker enqueues a token into every
other worker's queue and dequeues N - 1 from its own), built from public TF APIs. Synchronous
training in the sense of tf_cnn_benchmarks' ``cross_replica_sync``: no worker starts step t + 1
before all applied step t; each worker's gradient is applied separately with the momentum optimizer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_models import builder  # noqa: E402
from workload_args import add_workload_arguments  # noqa: E402

UPDATES = ("parameter_server", "distributed_replicated")


def _config(threads: int, task: int | None = None) -> tf.ConfigProto:
    config = tf.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=max(2, threads))
    if task is not None:  # a worker talks to the PS tasks and itself only (between-graph replication)
        config.device_filters.extend(["/job:ps", f"/job:worker/task:{task}"])
    return config


def _link_counters() -> list[int] | None:
    """This host's link counters (tx, rx bytes) where the harness named the link, else None."""
    link = os.environ.get("RALP_PIPE_LINK", "eth0")
    if "RALP_PIPE_HOST" not in os.environ:
        return None
    with open("/proc/self/net/dev") as handle:
        for line in handle:
            name, _, fields = line.partition(":")
            if name.strip() == link:
                values = fields.split()
                return [int(values[8]), int(values[0])]
    return None


def _initializer(name: str) -> tf.keras.initializers.Initializer:
    """torch's defaults: weights uniform in +-1/sqrt(fan_in), biases and BN shifts 0, BN scales 1."""
    if name.endswith("gamma"):
        return tf.ones_initializer()
    if name.endswith(("biases", "beta")):
        return tf.zeros_initializer()
    return tf.variance_scaling_initializer(scale=1.0 / 3.0, mode="fan_in", distribution="uniform", seed=0)


class Barriers:
    """Barriers among the workers, each a set of FIFO queues shared by name on a PS task (round robin)."""

    def __init__(self, task: int, workers: int, ps_tasks: int) -> None:
        self.task, self.workers, self.ps_tasks, self.count = task, workers, ps_tasks, 0

    def __call__(self, name: str, after: list[tf.Operation | tf.Tensor]) -> tf.Operation:
        with tf.device(f"/job:ps/task:{self.count % self.ps_tasks}/cpu:0"):
            queues = [
                tf.FIFOQueue(self.workers, [tf.bool], shapes=[[]], shared_name=f"{name}_q{i}", name=f"{name}_q{i}")
                for i in range(self.workers)
            ]
        self.count += 1
        with tf.control_dependencies(after):
            tokens = [q.enqueue(tf.constant(False)) for i, q in enumerate(queues) if i != self.task]
        with tf.control_dependencies(tokens):
            return tf.group(queues[self.task].dequeue_many(self.workers - 1))


def _graph(args: argparse.Namespace, cluster: tf.train.ClusterSpec) -> dict[str, object]:
    """Worker `args.task`'s training graph; returns the ops the loop runs."""
    workers, ps_tasks = len(args.workers.split(",")), len(args.ps.split(","))
    worker = f"/job:worker/task:{args.task}/cpu:0"
    barrier = Barriers(args.task, workers, ps_tasks)
    rng = np.random.default_rng(args.task)
    with tf.device(worker):
        images = tf.constant(rng.standard_normal((args.batch, args.size, args.size, 3), dtype=np.float32))
        labels = tf.constant(rng.integers(0, args.classes, args.batch))
    optimizer = tf.train.MomentumOptimizer(args.lr, 0.9)
    setter = tf.train.replica_device_setter(worker_device=worker, cluster=cluster)
    pairs: list[tuple[tf.Variable, tf.Variable]] = []  # (what the model computes on, what the PS holds)

    if args.update == "parameter_server":

        def variable(name: str, shape: list[int]) -> tf.Tensor:
            v = tf.get_variable(name, shape, initializer=_initializer(name), use_resource=False)
            pairs.append((v, v))
            return v

    else:

        def variable(name: str, shape: list[int]) -> tf.Tensor:
            with tf.device(setter):  # the PS copy, placed round robin as replica_device_setter places it
                shared = tf.get_variable(f"ps/{name}", shape, initializer=_initializer(name), use_resource=False)
            with tf.device(worker):
                local = tf.get_variable(
                    f"local/{name}",
                    shape,
                    initializer=tf.zeros_initializer(),
                    collections=[tf.GraphKeys.LOCAL_VARIABLES],
                    trainable=False,
                    use_resource=False,
                )
            pairs.append((local, shared))
            return local

    with tf.device(setter if args.update == "parameter_server" else worker):
        logits = builder(args.model)(images, variable, args.classes)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tf.gradients(loss, [used for used, _ in pairs])
    if args.update == "parameter_server":
        with tf.device(setter):
            apply = optimizer.apply_gradients(list(zip(grads, [shared for _, shared in pairs])))
        step = barrier("step_end", [apply])
        post_init: list[tf.Operation] = []
    else:
        updates = []
        for i, (grad, (local, shared)) in enumerate(zip(grads, pairs)):
            with tf.device(shared.device):
                apply = optimizer.apply_gradients([(grad, shared)])
            with tf.control_dependencies([barrier(f"var{i}", [apply])]), tf.device(worker):
                updates.append(local.assign(shared.read_value()))
        step = barrier("step_end", updates)
        with tf.device(worker):
            post_init = [local.assign(shared.read_value()) for local, shared in pairs]
    return {
        "step": step,
        "loss": loss,
        "window": barrier("window", []),
        "start": barrier("start", []),
        "post_init": post_init,
        "parameters": int(sum(np.prod(shared.shape.as_list()) for _, shared in pairs)),
    }


def _worker(args: argparse.Namespace, cluster: tf.train.ClusterSpec) -> None:
    server = tf.distribute.Server(cluster, "worker", args.task, config=_config(args.threads), start=True)
    ops = _graph(args, cluster)
    with tf.Session(server.target, config=_config(args.threads, args.task)) as session:
        global_vars = tf.global_variables()
        if args.task == 0:
            session.run(tf.variables_initializer(global_vars))
        else:
            pending = tf.report_uninitialized_variables(global_vars)
            while len(session.run(pending)):
                time.sleep(0.2)
        session.run(tf.local_variables_initializer())
        session.run(ops["post_init"])
        session.run(ops["start"])
        for _ in range(args.warmup):
            session.run([ops["step"], ops["loss"]])
        session.run(ops["window"])
        before, began = _link_counters(), time.perf_counter()
        times, losses = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            _, value = session.run([ops["step"], ops["loss"]])
            times.append(time.perf_counter() - t0)
            losses.append(float(value))
        session.run(ops["window"])
        window, after = time.perf_counter() - began, _link_counters()
        print(
            json.dumps(
                {
                    "task": args.task,
                    "window_s": window,
                    "step_s": times,
                    "loss": losses,
                    "counters": [before, after],
                    "parameters": ops["parameters"],
                }
            ),
            flush=True,
        )
        # the PS tasks hold the shared state: leave together so no worker's last reads are cut off
        session.run(ops["start"])


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the task it names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=["ps", "worker"])
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--ps", required=True, help="HOST:PORT of each PS task, comma separated")
    parser.add_argument("--workers", required=True, help="HOST:PORT of each worker task, comma separated")
    parser.add_argument("--update", choices=UPDATES, default="parameter_server")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    tf.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": args.ps.split(","), "worker": args.workers.split(",")})
    if args.job == "ps":
        tf.distribute.Server(cluster, "ps", args.task, config=_config(args.threads), start=True).join()
    else:
        _worker(args, cluster)


if __name__ == "__main__":
    main(sys.argv[1:])
