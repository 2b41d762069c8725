"""The device model against published single-GPU training throughput: fitted, then checked on figures left out.

    python benchmarks/device_model.py            # calibrate, print every figure and the held-out errors
    python benchmarks/device_model.py --write    # also write the fitted fields into config/device/arch/*.yaml
    python benchmarks/device_model.py --measured cuda.json --modelled modelled.json   # a GPU's profile vs its model

The first form prints, per published figure, the images/sec the calibrated architectures predict (in the
fit), each architecture's fields, then every figure left out of the whole calibration and predicted by it
(a generation of one figure: from the architecture it starts from, through its GPU's specs alone), with the
median and worst absolute error per generation. The second compares a profile measured on a
GPU (``ralp-pipe profile`` with ``cluster.device=cuda``) with the modelled profile of the same GPU
(``ralp-pipe profile --target auto``), unit by unit and for the whole step.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ralp_pipe.config import CONFIG_DIR, DeviceConfig, device_entries, load
from ralp_pipe.contract.records import Profile
from ralp_pipe.planning import calibration


def shipped() -> dict[str, DeviceConfig]:
    """Every device entry of config/device/ as composed by the package."""
    return {name: load([f"device={name}"]).device for name in device_entries()}


def write_fitted(fitted: dict[str, calibration.Fields]) -> None:
    """Replace the fitted fields' values in config/device/arch/<arch>.yaml, keeping every comment."""
    for arch, fields in fitted.items():
        path = CONFIG_DIR / "device" / "arch" / f"{arch}.yaml"
        text = path.read_text()
        for field in calibration.FITTED:
            text = re.sub(rf"^{field}: .*$", f"{field}: {fields[field]:.4g}", text, flags=re.M)
        path.write_text(text)


def report() -> list[calibration.Check]:
    """Print the calibrated predictions and the leave-one-out checks per generation; return the checks."""
    entries = shipped()
    fitted = calibration.calibrate(entries)
    print("published figure                     published  in the fit   error  (calibration)")
    for figure in calibration.PUBLISHED:
        device = entries[figure.device]
        predicted = calibration.predict(figure, calibration.with_fields(device, fitted[device.arch]))
        print(
            f"{figure.label:34s} {figure.images_per_sec:9.1f} {predicted:11.1f} "
            f"{predicted / figure.images_per_sec - 1:+7.1%}"
        )
    for step in calibration.PLAN:
        values = ", ".join(f"{n} {fitted[step.arch][n]:.4g}" for n in calibration.FITTED)
        print(f"  {step.arch}: {values}  ({step.why})")
    checks = calibration.leave_one_out(entries)
    print("\nleft out                             published   predicted   error  fitted on")
    for arch, own in calibration.by_arch(checks).items():
        for check in own:
            print(
                f"{check.figure.label:34s} {check.figure.images_per_sec:9.1f} {check.predicted:11.1f} "
                f"{check.error:+7.1%}  {check.fitted_on}"
            )
        worst = max(abs(c.error) for c in own)
        print(
            f"  {arch}: median |error| {calibration.median_abs_error(own):.1%}, worst {worst:.1%} ({len(own)} figures)"
        )
    print(f"median absolute error on {len(checks)} left-out figures: {calibration.median_abs_error(checks):.1%}")
    return checks


def compare(measured_path: Path, modelled_path: Path) -> None:
    """Print measured / modelled seconds per unit and batch, and for the whole forward+backward."""
    measured, modelled = Profile.read(measured_path), Profile.read(modelled_path)
    if [u["name"] for u in measured.units] != [u["name"] for u in modelled.units]:
        raise SystemExit(f"{measured_path} and {modelled_path} profile different models: compare like with like")
    print(
        f"measured {measured_path} ({measured.device}) / modelled {modelled_path} ({(modelled.target or {}).get('name')})"
    )
    for batch in sorted(set(measured.batches.values()) & set(modelled.batches.values())):
        totals = [0.0, 0.0]
        for mu, uu in zip(measured.units, modelled.units):
            m, u = mu["by_batch"][str(batch)], uu["by_batch"][str(batch)]
            fb_measured, fb_modelled = m["fwd_s"] + m["bwd_s"], u["fwd_s"] + u["bwd_s"]
            totals[0] += fb_measured
            totals[1] += fb_modelled
            ratio = f"x{fb_measured / fb_modelled:.2f}" if fb_modelled else "(no kernel: a view)"
            print(
                f"  batch {batch:4d} {mu['name']:18s} {fb_measured * 1e3:9.3f} ms {fb_modelled * 1e3:9.3f} ms {ratio}"
            )
        print(
            f"  batch {batch:4d} whole forward+backward {totals[0] * 1e3:9.2f} ms {totals[1] * 1e3:9.2f} ms "
            f"x{totals[0] / totals[1]:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fitted fields into config/device/*.yaml")
    parser.add_argument("--measured", type=Path, help="a profile measured on a GPU")
    parser.add_argument("--modelled", type=Path, help="the modelled profile of the same GPU (profile --target auto)")
    args = parser.parse_args()
    if args.measured or args.modelled:
        if not (args.measured and args.modelled):
            parser.error("--measured and --modelled go together")
        compare(args.measured, args.modelled)
        return
    if args.write:
        write_fitted(calibration.calibrate(shipped()))
    report()


if __name__ == "__main__":
    main()
