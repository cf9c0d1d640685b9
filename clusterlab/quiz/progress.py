"""The learner's quiz progress: a small local JSON file with Leitner-box spaced repetition.

Where: the path given explicitly, else $CLUSTERLAB_QUIZ_PROGRESS, else
~/.clusterlab/quiz_progress.json.

Spaced repetition (Leitner boxes): every question sits in box 1..5. A miss (wrong, skipped,
timed out, or an open question with fewer than 75% of its key points) sends it back to box 1
and makes it due at once; a pass moves it one box up and due again after that box's interval
(1 day, 3 days, 1 week, 3 weeks). Sessions ask due questions first (lowest box first), then
questions never seen, then the rest by due date, so what you miss comes back soonest.

History is never thrown away: a file that cannot be read as progress is moved aside to
``<name>.bak-<timestamp>`` and a fresh one is started; every write goes to a temporary file in
the same directory and is renamed over the old one with os.replace (atomic on POSIX and
Windows), so a crash mid-write leaves the previous file intact. Before writing, the file on
disk is merged in, so a terminal session and a notebook session do not erase each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .bank import PASS_SCORE

ENV_VAR = "CLUSTERLAB_QUIZ_PROGRESS"
DEFAULT_PATH = Path("~/.clusterlab/quiz_progress.json")
VERSION = 1
BOXES = 5
DAY = 86400.0
INTERVALS = {1: 0.0, 2: 1 * DAY, 3: 3 * DAY, 4: 7 * DAY, 5: 21 * DAY}  # box -> wait after a pass
HISTORY_PER_QUESTION = 20
SESSIONS_KEPT = 200


def default_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The progress file to use: `path`, else $CLUSTERLAB_QUIZ_PROGRESS, else the default."""
    chosen = path if path else os.environ.get(ENV_VAR) or DEFAULT_PATH
    return Path(chosen).expanduser()


def _fresh() -> dict[str, Any]:
    return {"version": VERSION, "questions": {}, "sessions": []}


def _valid(doc: object) -> bool:
    """Is `doc` a progress document we can use as is?"""
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return False
    qs, sessions = doc.get("questions"), doc.get("sessions")
    if not isinstance(qs, dict) or not isinstance(sessions, list):
        return False
    for rec in qs.values():
        if not isinstance(rec, dict):
            return False
        box, due, last = rec.get("box"), rec.get("due"), rec.get("last")
        if not (isinstance(box, int) and 1 <= box <= BOXES):
            return False
        if not all(isinstance(x, int | float) for x in (due, last)):
            return False
        if not isinstance(rec.get("history", []), list):
            return False
    return all(isinstance(s, dict) for s in sessions)


class Progress:
    """Progress of one learner. `path=None` uses `default_path()`; `save=False` keeps it in
    memory only (tests, demos)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        save: bool = True,
        clock=time.time,
    ):
        self.path = default_path(path) if save else None
        self.clock = clock
        self.recovered: Path | None = None  # where a corrupt file was moved, if it was
        self.data = self._read() if self.path else _fresh()

    # ---- file handling ---------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        assert self.path is not None
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _fresh()
        except (OSError, UnicodeDecodeError) as exc:
            return self._set_aside(f"cannot read: {exc}")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return self._set_aside(f"not JSON: {exc}")
        if not _valid(doc):
            return self._set_aside("not a quiz progress file of this version")
        return doc

    def _set_aside(self, reason: str) -> dict[str, Any]:
        """Move the unreadable file to <name>.bak-<timestamp> and start afresh."""
        assert self.path is not None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = self.path.with_name(f"{self.path.name}.bak-{stamp}")
        n = 1
        while backup.exists():
            backup = self.path.with_name(f"{self.path.name}.bak-{stamp}-{n}")
            n += 1
        try:
            os.replace(self.path, backup)
        except OSError as exc:  # cannot move it: leave it alone, never overwrite it
            warnings.warn(
                f"quiz progress file is unusable ({reason}) and could not be moved aside "
                f"({exc}); progress will not be saved this time",
                RuntimeWarning,
                stacklevel=3,
            )
            self.path = None
            return _fresh()
        self.recovered = backup
        warnings.warn(
            f"quiz progress file was unusable ({reason}); kept it as {backup.name} "
            "and started a fresh one",
            RuntimeWarning,
            stacklevel=3,
        )
        return _fresh()

    def save(self) -> None:
        """Merge with what is on disk now, then write atomically (temp file + os.replace)."""
        if self.path is None:
            return
        on_disk = None
        with contextlib.suppress(OSError, UnicodeDecodeError, json.JSONDecodeError):
            on_disk = json.loads(self.path.read_text(encoding="utf-8"))
        if _valid(on_disk):
            self.data = _merge(on_disk, self.data)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.data, f, ensure_ascii=False, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # ---- spaced repetition -------------------------------------------------------------------

    def record(self, qid: str, score: float, *, mode: str = "practice", save: bool = True) -> None:
        """Record one answer (score 0..1; unanswered = 0) and move the question's box."""
        now = self.clock()
        rec = self.data["questions"].setdefault(
            qid, {"box": 1, "due": now, "last": now, "seen": 0, "passed": 0, "history": []}
        )
        passed = score >= PASS_SCORE
        rec["box"] = min(rec["box"] + 1, BOXES) if passed else 1
        rec["due"] = now + INTERVALS[rec["box"]] if passed else now
        rec["last"] = now
        rec["seen"] = rec.get("seen", 0) + 1
        rec["passed"] = rec.get("passed", 0) + int(passed)
        history = rec.setdefault("history", [])
        history.append({"t": now, "score": round(float(score), 4), "mode": mode})
        del history[:-HISTORY_PER_QUESTION]
        if save:
            self.save()

    def record_session(self, summary: dict[str, Any], *, save: bool = True) -> None:
        entry = {"t": self.clock(), **summary}
        self.data["sessions"].append(entry)
        del self.data["sessions"][:-SESSIONS_KEPT]
        if save:
            self.save()

    def box(self, qid: str) -> int | None:
        rec = self.data["questions"].get(qid)
        return rec["box"] if rec else None

    def order(self, qids: Sequence[str], rng: random.Random | None = None) -> list[str]:
        """`qids` in the order to ask them: due (lowest box first), new, then not yet due."""
        rng = rng or random.Random()
        now = self.clock()
        shuffled = list(qids)
        rng.shuffle(shuffled)  # ties are broken at random, reproducibly with a seeded rng
        tiebreak = {qid: i for i, qid in enumerate(shuffled)}

        def key(qid: str) -> tuple:
            rec = self.data["questions"].get(qid)
            if rec is None:
                return (1, 0, 0.0, tiebreak[qid])
            if rec["due"] <= now:
                return (0, rec["box"], rec["due"], tiebreak[qid])
            return (2, 0, rec["due"], tiebreak[qid])

        return sorted(qids, key=key)

    def stats(self, qids: Iterable[str] | None = None) -> dict[str, int]:
        """How many questions are new, due, and in each box."""
        qs = self.data["questions"]
        ids = list(qids) if qids is not None else list(qs)
        now = self.clock()
        out = {"new": 0, "due": 0, **{f"box{b}": 0 for b in range(1, BOXES + 1)}}
        for qid in ids:
            rec = qs.get(qid)
            if rec is None:
                out["new"] += 1
                continue
            out[f"box{rec['box']}"] += 1
            out["due"] += rec["due"] <= now
        return out


def _merge(disk: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """Union of two progress documents: per question the most recently answered record wins;
    sessions are the union, in time order."""
    out = _fresh()
    out["questions"] = dict(disk["questions"])
    for qid, rec in mine["questions"].items():
        other = out["questions"].get(qid)
        if other is None or rec["last"] >= other["last"]:
            out["questions"][qid] = rec
    seen = set()
    sessions = []
    for s in sorted(disk["sessions"] + mine["sessions"], key=lambda s: s.get("t", 0)):
        key = json.dumps(s, sort_keys=True)
        if key not in seen:
            seen.add(key)
            sessions.append(s)
    out["sessions"] = sessions[-SESSIONS_KEPT:]
    return out
