from orchestrator.admission import ClusterCapacity, free_of, never_fits, reserved_by, shortfall
from orchestrator_contract.jobs import JobSpec

TWO_CPU = ClusterCapacity(total={"CPU": 2, "GPU": 0}, largest_node={"CPU": 2, "GPU": 0})


def test_a_job_that_fits_an_idle_cluster():
    assert never_fits(JobSpec(workload="digits"), TWO_CPU) is None


def test_more_workers_than_the_cluster_holds():
    reason = never_fits(JobSpec(workload="digits", scaling={"num_workers": 8}), TWO_CPU)
    assert reason == "needs 8 CPU for 8 workers but the whole cluster has 2 CPU"


def test_gpus_on_a_cpu_cluster():
    reason = never_fits(JobSpec(workload="digits", scaling={"num_workers": 1, "use_gpu": True}), TWO_CPU)
    assert "GPU" in reason and "has 0 GPU" in reason


def test_a_worker_larger_than_any_node():
    cluster = ClusterCapacity(total={"CPU": 8, "GPU": 0}, largest_node={"CPU": 4, "GPU": 0})
    spec = JobSpec(workload="digits", scaling={"num_workers": 1, "cpus_per_worker": 6})
    assert never_fits(spec, cluster) == "each worker needs 6 CPU but the largest node has 4 CPU"


def test_shortfall_reads_like_a_reason():
    free = free_of(TWO_CPU, reserved_by([{"CPU": 1.0}]))
    assert free == {"CPU": 1.0, "GPU": 0.0}
    assert shortfall({"CPU": 4.0, "GPU": 0.0}, free) == "needs 4 CPU, 1 free"
    assert shortfall({"CPU": 1.0, "GPU": 0.0}, free) is None
    assert shortfall({"CPU": 1.0, "GPU": 2.0}, free) == "needs 2 GPU, 0 free"
