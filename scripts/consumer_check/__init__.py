"""gpuarch's arch lists, read by the consumers' own parsing code.

For every fixture, each GPU alone and all of a fixture's GPUs together,
and every CUDA toolkit in gpuarch's table (`gpuarchctl arch toolkit`) plus
an unknown one: what gpuarchctl plans for a container with that
CUDA_VERSION, fed to

- torch's `_get_cuda_arch_flags`, extracted from torch's own
  `torch/utils/cpp_extension.py` of each pinned release (the macOS wheels
  carry the same file as the CUDA ones and are small), run as torch runs it;
- FlashInfer's `CompilationContext` (flashinfer-python, pure Python),
  whose constructor runs at `import flashinfer`;
- flash-attn's `cuda_archs()` and the gencode `if`s of its setup.py, on
  FLASH_ATTN_CUDA_ARCHS; accelerate's reading of ACCELERATE_MIXED_PRECISION;
- DeepSpeed's op builder (`compute_capability_args`, from its sdist), ahead
  of time and at JIT load, on TORCH_CUDA_ARCH_LIST.

And, with the JIT cache on, where torch, inductor, Triton, FlashInfer and
vLLM put their caches, given gpuarch-hook's env.

And FLASHINFER_CUBIN_DIR in every FlashInfer release that has a
flashinfer-cubin of its version: each release's own `_get_cubin_dir`.

None runs on a GPU here: `torch.cuda` and FlashInfer's CUDA version
probe are stand-ins that answer what the container would (the fixture's
GPUs, the toolkit). Asserted for each case:

- no exception from any, where gpuarch sets the variable;
- every architecture the flags ask for is one the toolkit builds (by
  gpuarch's table: the one check here that is gpuarch's own reading);
- gpuarch's output is never worse than the consumer's own default (the
  variable unset): every GPU that the default serves with something the
  toolkit can build (SASS of its family, exact for an `a` target, or PTX
  no newer than it), gpuarch's flags serve too. For torch the default is
  what a torch built with this toolkit picks (its `get_arch_list()` is the
  archs both torch and the toolkit know).

The table itself is checked against the NVRTC that scripts/test installs
(nvrtcGetSupportedArchs): the architectures it accepts must be the table's
for its release.

A torch release is paired with a toolkit when its own list of supported
arches names every architecture that toolkit builds and some pinned torch
knows (a torch built with that toolkit does); other pairs are not real
images and are not tested.

Wheels and sdists are downloaded once (torch's about 70 MB each, vLLM's
sdist 47 MB) and only the files read kept, under .local/consumers/.

Usage: scripts/consumers [--fetch]   (--fetch: download only)
"""
