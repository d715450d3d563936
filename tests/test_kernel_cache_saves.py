"""numba's cache saves serialised between processes (dpledger.mechanisms.fastmath.serialise_cache_saves):
two savers of one function's index, interleaved as two processes can be, each keep their own signature's
code. numba's own save lets the second saver's index overwrite the first's."""
import threading

from numba.core import caching

import dpledger.mechanisms.fastmath  # noqa: F401  (installs the serialised save)


def index_file(folder):
    """One function's cache index as a process opens it (its own in-memory state)."""
    return caching.IndexDataCacheFile(str(folder), "module.kernel-12.py311", ("mtime", 1234))


def test_the_serialised_save_is_installed():
    assert getattr(caching.IndexDataCacheFile.save, "serialised", False)


def test_two_savers_of_two_signatures_at_once_keep_each_its_own_code(tmp_path):
    first, second = index_file(tmp_path), index_file(tmp_path)
    read, resume = threading.Event(), threading.Event()
    load = first._load_index

    def read_then_wait():   # the first saver has read the index and not yet written it
        overloads = load()
        read.set()
        resume.wait(30)
        return overloads

    first._load_index = read_then_wait
    one = threading.Thread(target=first.save, args=(("float64",), {"code": "float64 kernel"}))
    one.start()
    assert read.wait(30)
    two = threading.Thread(target=second.save, args=(("int64",), {"code": "int64 kernel"}))
    two.start()
    two.join(0.5)   # numba's own save finishes here, from the index as it was before the first saver wrote
    resume.set()
    one.join(30)
    two.join(30)
    reader = index_file(tmp_path)
    assert reader.load(("float64",)) == {"code": "float64 kernel"}
    assert reader.load(("int64",)) == {"code": "int64 kernel"}


def test_saving_a_signature_again_replaces_its_code_in_place(tmp_path):
    saver = index_file(tmp_path)
    saver.save(("float64",), {"code": "old"})
    saver.save(("int64",), {"code": "other"})
    saver.save(("float64",), {"code": "new"})
    reader = index_file(tmp_path)
    assert reader.load(("float64",)) == {"code": "new"} and reader.load(("int64",)) == {"code": "other"}
    assert sorted(path.name for path in tmp_path.glob("*.nbc")) == ["module.kernel-12.py311.1.nbc",
                                                                      "module.kernel-12.py311.2.nbc"]


def test_a_stale_index_never_gets_a_data_file_a_reader_of_the_older_index_may_load(tmp_path):
    """A touch that keeps the source's content keeps the cache folder but changes the stamp: numba's own save
    then reads the index as empty and writes the new signature over .1.nbc, which a process holding the
    older index still names for another signature."""
    older = index_file(tmp_path)
    older.save(("float64",), {"code": "float64 kernel"})
    reader = index_file(tmp_path)
    overloads = reader._load_index()   # the reader has read the index, not yet the data
    newer = caching.IndexDataCacheFile(str(tmp_path), "module.kernel-12.py311", ("mtime", 5678))
    newer.save(("int64",), {"code": "int64 kernel (new stamp)"})
    assert reader._load_data(overloads[("float64",)]) == {"code": "float64 kernel"}
    assert newer.load(("int64",)) == {"code": "int64 kernel (new stamp)"}


def test_a_lock_the_file_system_refuses_falls_back_to_numbas_own_save(tmp_path, monkeypatch):
    import fcntl

    def refuse(*_):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    saver = index_file(tmp_path)
    saver.save(("float64",), {"code": "float64 kernel"})
    assert index_file(tmp_path).load(("float64",)) == {"code": "float64 kernel"}
