"""Registration, info() and the build check: the NCCL path must be compiled and linked
wherever torch is a CUDA build, GPU or not."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import streamnccl
import torch
import torch.distributed as dist


@pytest.mark.torch_internals
def test_import_registers_backend_for_cpu_and_cuda():
    assert "streamnccl" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["streamnccl"] == ["cpu", "cuda"]
    assert dist.Backend.STREAMNCCL == "streamnccl"


@pytest.mark.torch_internals
def test_info_reports_versions_and_paths():
    info = streamnccl.info()
    assert info["streamnccl"] == streamnccl.__version__
    assert info["torch"] == torch.__version__
    assert "host" in info["paths"]
    if "nccl" in info["paths"]:
        major, minor, patch = (int(x) for x in info["nccl_loaded"].split("."))
        assert (major, minor) >= (2, 0)
        assert info["nccl_compiled"].count(".") == 2
        assert info["cuda_compiled"] is not None


def test_nccl_path_is_built_when_torch_is_a_cuda_build():
    """Fails, not skips: a CUDA torch must give a build with the NCCL path."""
    info = streamnccl.info()
    if torch.version.cuda is None:
        assert info["paths"] == ["host"], "a CPU-only torch builds the host path only"
        assert info["nccl_compiled"] is None
    else:
        assert "nccl" in info["paths"], f"torch {torch.__version__} is a CUDA build: {info}"
        # The NCCL loaded at run time is the one torch loads; it must be usable.
        assert info["nccl_loaded"] is not None


@pytest.mark.torch_internals
def test_an_extension_built_against_another_torch_says_so_at_import():
    # As if the torch installed had changed since the build: the import names both versions
    # instead of failing at an undefined symbol (or loading and misreading torch's types).
    code = "import torch; torch.__version__ = '2.99.0+cpu'; import streamnccl"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    built = streamnccl._build_info.TORCH_VERSION
    assert built == torch.__version__
    assert (
        f"ImportError: streamnccl was built against torch {built}, but torch 2.99.0+cpu is "
        "running" in done.stderr
    ), done.stderr


@pytest.mark.torch_internals
def test_the_extension_carries_no_debug_info_and_the_product_no_test_doubles():
    # Debug info was 62 of the extension's 64 MB. The test doubles are a module of their own,
    # which `import streamnccl` does not load.
    sections = subprocess.run(
        ["readelf", "-S", "-W", streamnccl._C.__file__], capture_output=True, text=True, check=True
    ).stdout
    assert ".debug_info" not in sections
    symbols = subprocess.run(
        ["nm", "-DC", "--defined-only", streamnccl._C.__file__],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "streamnccl::fake::" not in symbols and "streamnccl::sim::" not in symbols
    assert "streamnccl::testing::" not in symbols and "TestFault" not in symbols
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, streamnccl; print(sorted(sys.modules))"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "streamnccl._C" in loaded and "streamnccl._testing" not in loaded


def test_extension_links_the_nccl_library():
    info = streamnccl.info()
    if torch.version.cuda is None:
        pytest.skip("CPU-only torch: no NCCL to link")
    libs = subprocess.run(
        ["ldd", streamnccl._C.__file__], capture_output=True, text=True, check=True
    ).stdout
    assert "libnccl.so.2" in libs, libs
    assert "nccl" in info["paths"]


def test_errors_name_their_source_file_from_the_project_root():
    """__FILE__ in an error (TORCH_CHECK, an NCCL call's) reads csrc/...: nothing of the folder
    the extension was built in reaches a user's log."""
    root = Path(__file__).resolve().parents[1]
    binary = Path(streamnccl._C.__file__).read_bytes()
    assert b"csrc/core/ProcessGroup.cpp" in binary
    assert (str(root) + "/csrc").encode() not in binary


# Symbols that only libstdc++ itself defines (no user's code instantiates them): a library that
# defines one carries its own copy of libstdc++.
LIBSTDCXX_OWN_SYMBOLS = {
    "_ZNSt6locale7classicEv": "std::locale::classic()",
    "_ZNSo9_M_insertIlEERSoT_": "std::ostream::_M_insert<long>",
}


def libstdcxx_copied_into(library) -> list[str]:
    defined = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for symbol, name in LIBSTDCXX_OWN_SYMBOLS.items() if symbol in defined]


def test_the_extension_uses_the_libstdcxx_torch_loads():
    """A copy of libstdc++ inside the extension mixes with the one torch loaded: on a GPU
    machine, writing an integer to a std::ostringstream (a flight recorder dump, an error
    message) crashed the process."""
    assert libstdcxx_copied_into(streamnccl._C.__file__) == []
    libs = subprocess.run(
        ["ldd", streamnccl._C.__file__], capture_output=True, text=True, check=True
    ).stdout
    assert "libstdc++.so.6" in libs, libs


@pytest.mark.slow
def test_a_compiler_that_links_libstdcxx_statically_still_gives_no_copy(tmp_path):
    """The extension linked again, as a compiler that links libstdc++ statically links it (the
    GPU machine's did): setup.py names torch's libstdc++ first, so nothing is copied in."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, LDFLAGS="-static-libstdc++", MAX_JOBS="2")
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (library,) = (tmp_path / "streamnccl").glob("_C*.so")
    assert libstdcxx_copied_into(library) == []


def test_python_dash_m_prints_info_as_json():
    out = subprocess.run(
        [sys.executable, "-m", "streamnccl"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    printed = json.loads(out)
    assert printed["streamnccl"] == streamnccl.__version__
    assert printed["paths"] == streamnccl.info()["paths"]


def test_options_explicit_values_win_over_environment(monkeypatch):
    monkeypatch.setenv("STREAMNCCL_BLOCKING_WAIT", "1")
    monkeypatch.setenv("STREAMNCCL_HIGH_PRIORITY_STREAMS", "0")
    resolved = streamnccl.Options(high_priority_streams=True).resolved()
    assert resolved.high_priority_streams is True  # explicit
    assert resolved.blocking_wait is True  # from the environment
    assert streamnccl.Options().resolved().high_priority_streams is False


def test_options_default_when_environment_is_unset(monkeypatch):
    monkeypatch.delenv("STREAMNCCL_BLOCKING_WAIT", raising=False)
    monkeypatch.delenv("STREAMNCCL_HIGH_PRIORITY_STREAMS", raising=False)
    resolved = streamnccl.Options().resolved()
    assert resolved.blocking_wait is False
    assert resolved.high_priority_streams is False


def test_options_reject_a_malformed_environment_value(monkeypatch):
    monkeypatch.setenv("STREAMNCCL_BLOCKING_WAIT", "maybe")
    with pytest.raises(ValueError, match="STREAMNCCL_BLOCKING_WAIT='maybe' is not a boolean"):
        streamnccl.Options().resolved()


def test_options_reject_bad_fault_handling_settings():
    with pytest.raises(ValueError, match="trace_buffer_size is -1"):
        streamnccl.Options(trace_buffer_size=-1).resolved()


def test_a_malformed_test_fault_is_refused():
    from streamnccl import _testing

    with pytest.raises(ValueError, match="STREAMNCCL_TEST_FAULT rank='one' is not a non-negative"):
        _testing.parse_test_fault("rank=one,op=2")
    with pytest.raises(ValueError, match="action is 'explode', expected fail or delay"):
        _testing.parse_test_fault("rank=1,op=2,action=explode")
    with pytest.raises(ValueError, match="needs rank=R and op=N"):
        _testing.parse_test_fault("rank=1")
    assert _testing.parse_test_fault("rank=1,op=2,action=delay,ms=5") == {
        "rank": 1, "op": 2, "fail": False, "delay_ms": 5,
    }  # fmt: skip


FIRST_OP = """
import sys, torch, torch.distributed as dist, streamnccl
if sys.argv[1] == "with-testing":
    import streamnccl._testing
dist.init_process_group("streamnccl", store=dist.HashStore(), rank=0, world_size=1)
try:
    dist.all_reduce(torch.ones(2))
    print("ran")
except dist.DistBackendError as e:
    print("failed:", e)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("testing", ["without", "with-testing"])
def test_fault_injection_is_the_test_doubles_alone(testing):
    """STREAMNCCL_TEST_FAULT does nothing in the product: only streamnccl._testing, imported,
    adds its hook to the groups made after."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_OP, testing],
        env=dict(os.environ, STREAMNCCL_TEST_FAULT="rank=0,op=1,action=fail"),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    if testing == "without":
        assert done.stdout.strip() == "ran", done.stdout + done.stderr
    else:
        assert "injected fault (STREAMNCCL_TEST_FAULT)" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "config, refusal",
    [
        ({"blocking": True}, "always non-blocking"),
        ({"cga_cluster_size": -1}, r"cga_cluster_size is -1; expected 0 to 8"),
        ({"cga_cluster_size": 9}, r"cga_cluster_size is 9; expected 0 to 8"),
        ({"min_ctas": 0}, r"min_ctas is 0; expected 1 to 64"),
        ({"max_ctas": 65}, r"max_ctas is 65; expected 1 to 64"),
        ({"min_ctas": 8, "max_ctas": 4}, r"min_ctas \(8\) is more than config.max_ctas \(4\)"),
        ({"net_name": ""}, "net_name is empty"),
    ],
)
def test_options_refuse_an_nccl_config_nccl_would_refuse(config, refusal):
    with pytest.raises(ValueError, match=refusal):
        streamnccl.Options(config=streamnccl.NcclConfig(**config)).resolved()


def test_options_carry_the_nccl_config_and_torchs_nonblocking_variable(monkeypatch):
    config = streamnccl.NcclConfig(cga_cluster_size=2, min_ctas=4, max_ctas=8, net_name="Socket")
    resolved = streamnccl.Options(config=config).resolved().config
    assert (resolved.cga_cluster_size, resolved.min_ctas, resolved.max_ctas) == (2, 4, 8)
    assert (resolved.net_name, resolved.split_share, resolved.blocking) == ("Socket", None, None)
    monkeypatch.setenv("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")
    assert streamnccl.Options().resolved().config.blocking is False
    monkeypatch.setenv("TORCH_NCCL_USE_COMM_NONBLOCKING", "0")
    with pytest.raises(ValueError, match="TORCH_NCCL_USE_COMM_NONBLOCKING=0"):
        streamnccl.Options().resolved()


@pytest.mark.parametrize(
    "variable, value, refused",
    [
        ("NCCL_COMM_BLOCKING", "1", True),
        ("NCCL_COMM_BLOCKING", "0", False),
        ("NCCL_COMM_SHRINK_SHARE_RESOURCES", "1", True),
        ("NCCL_COMM_SHRINK_SHARE_RESOURCES", "0", False),
    ],
)
def test_options_refuse_the_nccl_variables_that_would_override_streamnccls_config(
    monkeypatch, variable, value, refused
):
    # NCCL's variables override the config it is given: these two would make communicators
    # blocking, or a shrunk one share the old one's abort flag, whatever streamnccl asks.
    monkeypatch.setenv(variable, value)
    if refused:
        with pytest.raises(ValueError, match=f"{variable}.*unset it or set it to 0"):
            streamnccl.Options().resolved()
    else:
        streamnccl.Options().resolved()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["gpu-check", "gpu-report"])
def test_the_gpu_scripts_say_there_is_no_gpu_and_pass(script, tmp_path):
    """scripts/gpu-check.sh and gpu-report.sh, the commands for a GPU machine, exit 0 at once
    without one, saying so."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        ["bash", str(root / "scripts" / f"{script}.sh"), str(tmp_path / "report")],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{script}: no CUDA device is visible" in done.stdout


def product_flags(testing: str) -> dict:
    """What setup.py gives streamnccl._C to compile and link with, with or without the test
    doubles, read in a child that runs setup.py with setuptools' setup() replaced."""
    script = (
        "import json, runpy, setuptools\n"
        "made = {}\n"
        "setuptools.setup = lambda **kw: made.update(kw)\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "(product,) = [e for e in made['ext_modules'] if e.name == 'streamnccl._C']\n"
        "print(json.dumps({k: getattr(product, k) for k in ('include_dirs', 'library_dirs',\n"
        "    'libraries', 'define_macros', 'extra_compile_args', 'extra_link_args')}))\n"
    )
    env = dict(os.environ, STREAMNCCL_BUILD_TESTING=testing)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
        cwd=Path(__file__).resolve().parent.parent, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_product_builds_alike_with_or_without_the_test_doubles():
    """The two extensions once shared one list of include folders, which torch's extension
    added to for each: with the doubles built too, _C's compile command named torch's and
    CUDA's headers twice, so a later build of _C alone (the static-libstdc++ test above, a
    wheel) found every command changed and compiled the whole product again."""
    assert product_flags("1") == product_flags("0")
