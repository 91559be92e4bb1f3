"""``specdec-course bench hf`` (Hugging Face's generate against the package's loops) and
``bench roofline`` (the GPU cost model, no measurement); and what every bench shares: where it
writes (``--record`` or a scratch folder) and its arguments checked before it measures."""

from __future__ import annotations

from . import set_threads


def checked(args) -> None:
    """Refuse a bad ``--temperature`` before minutes of measuring; then set ``args.out``."""
    from ..sampling import check_processing

    if getattr(args, "temperature", None) is not None:
        try:
            check_processing(args.temperature, None, None)
        except ValueError as e:
            raise ValueError(f"--temperature {args.temperature:g}: {e}") from None
    _where(args)


def add_out(p) -> None:
    """Where a bench writes: a scratch folder unless told to replace the committed records."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--record",
        action="store_true",
        help="replace the committed records in data/results/ (what `generate` and the lessons "
        "read); without it the results go to bench-results/ (git-ignored scratch)",
    )
    where.add_argument("--out", default=None, help="write the results to this folder instead")


def _where(args) -> None:
    """``args.out``: --out as given, data/results/ with --record, else bench-results/ (a dry
    GPU check keeps its temporary folder)."""
    from ..paths import results_dir, scratch_dir

    if getattr(args, "record", False):
        args.out = str(results_dir())
    elif getattr(args, "out", None) is None and not getattr(args, "dry", False):
        args.out = str(scratch_dir())


def add_hf(what) -> None:
    h = what.add_parser(
        "hf",
        help="Hugging Face generate (plain, assisted, prompt lookup) against the package's "
        "loops, this CPU (lesson 10; needs the [hf] extra)",
        description="Export the shipped pair to transformers' GPT2LMHeadModel and decode the "
        "validation prompts (200 new characters each), one thread, batch 1, in rotating "
        "order, with HF's plain generate, HF assisted generation (the draft model: fixed k, "
        "HF's heuristic schedule, HF's defaults), HF prompt lookup, and the package's plain, "
        "draft-model, n-gram and distilled n-gram loops (each at its best k of the stored "
        "bench speedup record); print tokens per second and speedups over each side's plain "
        "decoding and over HF's, profile where the per-token time goes, and write "
        "hf_cpu.json and hf_cpu.png to bench-results/, or with --record to data/results/ "
        "(read by lesson 10). Needs "
        "pip install -e '.[hf]'.",
    )
    h.add_argument("--repeats", type=int, default=5, help="rotating repeats; the median is kept")
    h.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="measure at this temperature only (default: 0, then 1)",
    )
    add_out(h)
    h.set_defaults(run=_hf)


def _hf(args) -> int:
    """HF generate against the package's loops (bench.hf_race), this CPU, one thread."""
    checked(args)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    try:
        from ..bench import hf_race as bench_hf
        from ..hf import require_transformers

        require_transformers()
    except ImportError as e:
        raise ValueError(str(e)) from None
    set_threads(1)
    temps = (args.temperature,) if args.temperature is not None else (0.0, 1.0)
    record = bench_hf.measure_hf(temperatures=temps, repeats=args.repeats, progress=True)
    for race in record["runs"]:
        print(bench_hf.format_hf_table(race))
    command = bench_hf.COMMAND + ("" if args.repeats == 5 else f" --repeats {args.repeats}")
    if args.temperature is not None:
        command += f" --temperature {args.temperature:g}"
    for path in bench_hf.save_hf_results(record, command, args.out):
        print(f"wrote {path}")
    return 0


class LazyChoices:
    """``choices`` read from the package only when an argument is checked or a help printed:
    the names live in ``bench.roofline``, whose import takes torch (seconds), and building the
    parser must not."""

    def __init__(self, name: str):
        self.name = name

    def _names(self):
        from .. import bench

        return sorted(getattr(bench, self.name))

    def __iter__(self):
        return iter(self._names())

    def __contains__(self, value) -> bool:
        return value in self._names()


def add_roofline(what, run) -> None:
    r = what.add_parser(
        "roofline",
        help="a MODEL, not a measurement: a GPU call priced by bytes and flops, and the "
        "speedups it predicts at this course's measured acceptance",
        description="A roofline model, not a measurement (bench.roofline): price one target "
        "call of n new tokens for B sequences by the bytes it moves (weights once per call, "
        "the KV cache, activations) and its flops at a GPU's published peaks, print its cost "
        "over a one-token call and the ridge where it turns compute bound, then each "
        "method's best speedup by Theorem 3.8 and with the call priced, at the acceptance "
        "stored in data/results/ (speedup_cpu.json, eagle_cpu.json). Where a GPU record is "
        "stored (tools/gpu_check.sh), it says so: that one is measured.",
    )
    gpus, shapes = LazyChoices("GPUS"), LazyChoices("SHAPES")
    r.add_argument(
        "--gpu",
        choices=gpus,
        metavar="GPU",
        default="h200",
        help="whose published peaks: %(choices)s",
    )
    r.add_argument(
        "--target",
        choices=shapes,
        metavar="SHAPE",
        default="llama-3-8b",
        help="target shape: %(choices)s",
    )
    r.add_argument(
        "--draft",
        choices=shapes,
        metavar="SHAPE",
        default="llama-3.2-1b",
        help="the draft model's shape (as --target)",
    )
    r.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="batch sizes")
    r.add_argument(
        "--context",
        type=int,
        default=None,
        help="tokens already cached per row (default: bench.roofline.DEFAULT_CONTEXT, 1024)",
    )
    r.add_argument("--overhead-us", type=float, default=0.0, help="fixed cost per call, in us")
    r.add_argument("--temperature", type=float, default=1.0, help="whose stored acceptance")
    r.set_defaults(run=run)


def roofline(args) -> int:
    """The roofline model's table (bench.roofline_methods.format_roofline_report)."""
    from .. import bench

    if args.context is None:
        args.context = bench.DEFAULT_CONTEXT
    print(
        bench.format_roofline_report(
            gpu=args.gpu,
            target=args.target,
            draft=args.draft,
            batches=tuple(args.batch),
            context=args.context,
            overhead_s=args.overhead_us * 1e-6,
            temperature=args.temperature,
        )
    )
    return 0
