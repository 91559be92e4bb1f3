"""``specdec-course export --format hf DIR``: the shipped pair as Hugging Face model folders."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write the shipped target and draft as Hugging Face transformers folders",
        description="Write the shipped target and draft to DIR/target and DIR/draft as "
        "transformers GPT2LMHeadModel folders (config.json, model.safetensors, "
        "generation_config.json and the character tokenizer), readable with "
        "GPT2LMHeadModel.from_pretrained(DIR/target) and AutoTokenizer.from_pretrained("
        "DIR/target) or specdec_course.hf.from_pretrained; nothing is downloaded. Needs "
        "pip install -e '.[hf]'.",
    )
    p.add_argument(
        "--format", choices=["hf"], required=True, help="the format to write (hf: transformers)"
    )
    p.add_argument("dir", metavar="DIR", help="folder to write target/ and draft/ into")
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        from .. import hf

        hf.require_transformers()
    except ImportError as e:
        raise ValueError(str(e)) from None
    for name, path in hf.export_pair(args.dir).items():
        print(f"wrote {name}: {path}")
    return 0
