#!/usr/bin/env python3
"""A worker for sluice's `queue` algorithm.

A request admitted by a `queue` limit appends one entry to a Redis Stream: the descriptor's entries as fields. The
response names the stream and the entry in `dynamic_metadata.sluice.queued` (`{descriptor, stream, entry_id}`).
This worker reads the stream through a consumer group, handles each entry, then acknowledges and deletes it, which
frees its place in the queue for the next request. Entries that wait longer than the limit's window are abandoned
by sluice (trimmed on the next append), so handle work promptly or size the window for it.

    pip install redis
    python queue_worker.py --redis redis://127.0.0.1:6379 --stream '<stream key from the response>'

Run several workers with different --consumer names to share the work. --once handles what is waiting and exits.
"""

import argparse
import sys

import redis


def ensure_group(r: redis.Redis, stream: str, group: str) -> bool:
    """Creates the consumer group at the start of the stream; False while the stream does not exist yet."""
    try:
        r.xgroup_create(stream, group, id="0")
    except redis.ResponseError as e:
        if "BUSYGROUP" in str(e):
            return True
        if "requires the key to exist" in str(e):
            return False
        raise
    return True


def handle(entry_id: str, fields: dict[str, str]) -> None:
    """The work itself. Replace with yours; this one prints the descriptor entries."""
    print(f"{entry_id} {fields}", flush=True)


def run(url: str, stream: str, group: str, consumer: str, once: bool, block_ms: int) -> int:
    r = redis.Redis.from_url(url, decode_responses=True)
    handled = 0
    while True:
        if not ensure_group(r, stream, group):
            if once:
                return handled
            r.xread({stream: "0"}, count=1, block=block_ms)  # wait for the stream to appear
            continue
        try:
            batches = r.xreadgroup(group, consumer, {stream: ">"}, count=10, block=None if once else block_ms)
        except redis.ResponseError as e:
            # The stream expired while idle and took its group with it: create both again on the next append.
            if "NOGROUP" in str(e):
                continue
            raise
        entries = [entry for _, batch in batches or [] for entry in batch]
        for entry_id, fields in entries:
            handle(entry_id, fields)
            # Acknowledge, then delete: the deletion is what frees the place in sluice's queue.
            pipe = r.pipeline()
            pipe.xack(stream, group, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()
            handled += 1
        if once and not entries:
            return handled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="the Redis sluice uses")
    parser.add_argument("--stream", required=True, help="the stream key (dynamic_metadata.sluice.queued[].stream)")
    parser.add_argument("--group", default="workers", help="consumer group name")
    parser.add_argument("--consumer", default="worker-1", help="this worker's name within the group")
    parser.add_argument("--once", action="store_true", help="handle what is waiting, then exit")
    parser.add_argument("--block-ms", type=int, default=5000, help="how long one read waits for new entries")
    args = parser.parse_args()
    handled = run(args.redis, args.stream, args.group, args.consumer, args.once, args.block_ms)
    print(f"handled {handled} entries", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
