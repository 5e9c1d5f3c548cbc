"""A batch claim is capped by payload bytes as well as by count (issue 24), on SQLite and
PostgreSQL: a batch holds at most ``max_bytes`` of payload, or one job, and is decided by sizes kept
at enqueue (the rules are CLAIM's, in tether/ledger/statements/sqlite.sql)."""

from __future__ import annotations

from typing import Any, ClassVar

from jobkit import Note, NoteType, registry_with
from tether import CreateFile, JobContext, JobType, Payload
from tether.ledger.catalogue import INLINE_PAYLOAD
from tether.ledger.record import JobRecord


class Blob(Payload):
    job_type: ClassVar[str] = "blob"
    data: str


class BlobType(JobType[Blob]):
    """Does nothing with its data: a fast job with a payload of any size."""

    name = "blob"
    payload_model = Blob

    def run(self, payload: Blob, ctx: JobContext) -> None:
        return None


class LimitedBlob(Blob):
    job_type: ClassVar[str] = "limited_blob"


class LimitedBlobType(JobType[LimitedBlob]):
    name = "limited_blob"
    payload_model = LimitedBlob
    max_running = 10

    def run(self, payload: LimitedBlob, ctx: JobContext) -> None:
        return None


def blobs(coordinator: Any, *sizes: int, kind: type[Blob] = Blob) -> list[JobRecord]:
    """One job per size, enqueued one by one (in this order), each payload about that many bytes."""
    return [coordinator.enqueue(kind(data="x" * size)).job for size in sizes]


def ids(jobs: list[JobRecord]) -> list[str]:
    return [job.id for job in jobs]


def test_a_batch_takes_jobs_while_their_payloads_fit_in_max_bytes(make_coordinator):
    c = make_coordinator(registry_with(BlobType()))
    jobs = blobs(c, *[10_000] * 10)
    size = jobs[0].payload_bytes
    assert size is not None and size > 10_000

    claimed = c.queue.claim("w", limit=100, max_bytes=3 * size + size // 2)

    assert ids(claimed) == ids(jobs[:3])
    assert ids(c.queue.claim("w", limit=100, max_bytes=3 * size)) == ids(jobs[3:6])  # exactly full fits


def test_a_job_larger_than_max_bytes_is_claimed_alone(make_coordinator):
    c = make_coordinator(registry_with(BlobType()))
    big, small = blobs(c, 50_000, 10)

    assert ids(c.queue.claim("w", limit=100, max_bytes=1_000)) == [big.id]
    assert ids(c.queue.claim("w", limit=100, max_bytes=1)) == [small.id]  # always at least one


def test_a_job_larger_than_the_batch_share_is_left_for_the_next_claim_which_it_leads(make_coordinator):
    c = make_coordinator(registry_with(BlobType()))
    first, second, big, last = blobs(c, 1_000, 1_000, 50_000, 1_000)
    cap = 10_000

    assert ids(c.queue.claim("w", limit=100, max_bytes=cap)) == [first.id, second.id, last.id]
    assert ids(c.queue.claim("w", limit=100, max_bytes=cap)) == [big.id]


def test_a_batch_led_by_a_large_job_takes_as_many_as_fit_of_jobs_no_larger(make_coordinator):
    c = make_coordinator(registry_with(BlobType()))
    jobs = blobs(c, 20_000, 10_000, 30_000, 20_000, 20_000)
    cap = 65_000  # three of the first job's size

    assert ids(c.queue.claim("w", limit=100, max_bytes=cap)) == ids([jobs[0], jobs[1], jobs[3]])
    assert ids(c.queue.claim("w", limit=100, max_bytes=cap)) == ids([jobs[2], jobs[4]])  # two of 30,000


def test_a_payload_the_claim_leaves_out_of_its_rows_is_read_whole(make_coordinator):
    c = make_coordinator(registry_with(BlobType()))
    small = c.enqueue(Blob(data="s")).job
    large = c.enqueue(Blob(data="é✓" * INLINE_PAYLOAD)).job  # past the inline size, not ASCII

    claimed = c.queue.claim("w", limit=10, max_bytes=1 << 30)

    assert [(j.id, j.payload) for j in claimed] == [(small.id, small.payload), (large.id, large.payload)]


def test_every_insert_keeps_the_payload_size_in_bytes(make_coordinator):
    c = make_coordinator(registry_with(NoteType()))
    text = "naïve ✓ " * 100
    single = c.enqueue(CreateFile(path="one.txt", text=text)).job
    keyed = c.enqueue(CreateFile(path="keyed.txt", text=text), key="k").job
    targeted = [r.job for r in c.enqueue_many([CreateFile(path=f"t{i}.txt", text=text) for i in range(3)])]
    untargeted = [r.job for r in c.enqueue_many([Note(name=text + str(i)) for i in range(3)])]

    for job in [single, keyed, *targeted, *untargeted]:
        stored = c.get(job.id)
        assert stored.payload_bytes == len(stored.payload.encode("utf-8")) != len(stored.payload), job.type


def test_types_with_max_running_share_the_batch_bytes(make_coordinator):
    c = make_coordinator(registry_with(BlobType(), LimitedBlobType()))
    plain = blobs(c, 1_000, 1_000)
    limited = blobs(c, 1_000, 1_000, 1_000, kind=LimitedBlob)
    size = plain[0].payload_bytes
    assert size is not None

    claimed = c.queue.claim("w", limit=100, max_bytes=3 * size + size // 2)

    assert ids(claimed) == ids(plain) + ids(limited[:1])  # the limited type gets what is left


def test_a_limited_type_claimed_first_takes_a_job_larger_than_max_bytes(make_coordinator):
    c = make_coordinator(registry_with(BlobType(), LimitedBlobType()))
    [big] = blobs(c, 50_000, kind=LimitedBlob)

    assert ids(c.queue.claim("w", limit=100, max_bytes=1_000)) == [big.id]


def test_a_limited_type_may_end_a_batch_one_job_past_max_bytes_but_not_two(make_coordinator):
    c = make_coordinator(registry_with(BlobType(), LimitedBlobType()))
    plain = blobs(c, 1_000, 1_000)
    limited = blobs(c, 10_000, 10_000, kind=LimitedBlob)
    size = plain[0].payload_bytes
    assert size is not None

    claimed = c.queue.claim("w", limit=100, max_bytes=2 * size + 100)

    assert ids(claimed) == ids(plain) + ids(limited[:1])  # 100 bytes were left: one job, not starved


def test_the_worker_claims_batches_of_batch_bytes(make_coordinator, monkeypatch):
    c = make_coordinator(registry_with(BlobType()))
    jobs = blobs(c, *[10_000] * 10)
    size = jobs[0].payload_bytes
    assert size is not None
    batches: list[int] = []
    claim, finish_and_claim = c.queue.claim, c.queue.finish_and_claim

    def counted_claim(*args: Any, **kwargs: Any) -> list[JobRecord]:
        batches.append(len(taken := claim(*args, **kwargs)))
        return taken

    def counted_finish(*args: Any, **kwargs: Any) -> Any:
        moved, taken = finish_and_claim(*args, **kwargs)
        batches.append(len(taken))
        return moved, taken

    monkeypatch.setattr(c.queue, "claim", counted_claim)
    monkeypatch.setattr(c.queue, "finish_and_claim", counted_finish)

    assert c.run_until_idle(batch_bytes=2 * size, slow_job=60.0) == 10

    assert max(batches) == 2 and sum(batches) == 10
