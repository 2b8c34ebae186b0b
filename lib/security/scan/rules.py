"""The data of Gate 2a: which names the scanner refuses, allows or must know.

Plain constants, no logic: the token checks (:mod:`.token_checks`), the call
allowlist (:mod:`.calls`), the kernel-shape checks (:mod:`.kernel`), the
conditional evaluator (:mod:`.conditions`) and the preprocessor
(:mod:`.preprocessor`) read them. Each forbidden-name table maps an
identifier to ``(check id, what it is)``; the check id is the one reported.
"""

from __future__ import annotations

import re

# The only headers a kernel may include: half and bfloat16 types, nothing that
# reaches the host or the file system.
ALLOWED_INCLUDES = frozenset({"cuda_fp16.h", "cuda_bf16.h"})

# C++ keywords: a macro may not redefine one (the source would read one way to
# the scanner and another to the compiler), a keyword is never a function's
# name, and an operator right after one (``return +[]...``) is unary.
KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char
char8_t char16_t char32_t class compl concept const consteval constexpr
constinit const_cast continue co_await co_return co_yield decltype default
defined delete do double dynamic_cast else enum explicit export extern false
float for friend goto if inline int long mutable namespace new noexcept not
not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef
typeid typename union unsigned using virtual void volatile wchar_t while xor
xor_eq
""".split())


def _names(check: str, what: str, words: str) -> dict[str, tuple[str, str]]:
    return {w: (check, what) for w in words.split()}


# Forbidden wherever the identifier appears (as a whole identifier): these
# names have no harmless use in a kernel, so even a mention is refused.
STRONG: dict[str, tuple[str, str]] = {
    **_names("token.asm", "inline assembly", "asm __asm__ __asm"),
    **_names("token.os_call", "host/OS call", """
        system popen pclose fork vfork clone posix_spawn posix_spawnp dlopen
        dlsym dlclose dlmopen mmap munmap mprotect getenv setenv putenv
        unsetenv secure_getenv ptrace syscall socket socketpair execveat
        fexecve gethostbyname getaddrinfo"""),
    **_names("token.file_io", "file I/O", """
        fopen freopen fdopen fread fwrite fprintf vfprintf fputs fputc fgets
        fgetc fscanf fclose fflush fseek ftell rewind tmpfile tmpnam mkstemp
        opendir readdir FILE stdin stdout stderr ifstream ofstream fstream"""),
    **_names("token.printf", "console output", """
        printf vprintf sprintf snprintf vsprintf vsnprintf puts putchar scanf
        sscanf cout cerr clog"""),
    **_names("token.malloc", "dynamic allocation", """
        malloc calloc realloc aligned_alloc memalign posix_memalign valloc
        alloca __builtin_alloca new cudaMalloc cudaMallocAsync cudaMallocManaged
        cudaMallocPitch cudaFree cudaFreeAsync __nv_aligned_device_malloc"""),
    **_names("token.trap", "trap or assertion", """
        __trap __brkpt assert __assert_fail __assertfail __builtin_trap
        __builtin_debugtrap abort"""),
    **_names("token.device_launch", "device-side launch", """
        cudaLaunchKernel cudaLaunchKernelEx cudaLaunchDevice
        cudaLaunchCooperativeKernel cudaGraphLaunch cudaGetParameterBuffer
        cudaGetParameterBufferV2 cudaDeviceSynchronize"""),
    **_names("token.function_pointer", "indirect call", "virtual"),
    **_names("pp._Pragma", "pragma operator", "_Pragma __pragma"),
    **_names("pp.include", "include probe",
             "__has_include __has_include_next __has_embed"),
}
# Forbidden only when followed by a call parenthesis: these are common words
# (``read``, ``open``, ``free``) that a kernel may use as variable names.
WEAK: dict[str, tuple[str, str]] = {
    **_names("token.os_call", "host/OS call", """
        kill connect bind listen accept send recv sendto recvfrom sendmsg
        recvmsg exit _exit atexit chmod chown ioctl fcntl"""),
    **_names("token.file_io", "file I/O", """
        open openat creat read write close pread pwrite unlink remove rename
        dup dup2 pipe stat lstat fstat"""),
    **_names("token.malloc", "dynamic allocation", "free"),
}
# Names refused wherever they appear, by pattern: compiler builtins (host
# intrinsics outside the CUDA API) and the CUDA runtime API, which a kernel
# reaches only through the device runtime (dynamic parallelism).
PATTERNS: tuple[tuple[re.Pattern, tuple[str, str]], ...] = (
    (re.compile(r"__(?:builtin|atomic|sync)_\w+"), ("token.call", "compiler builtin")),
    (re.compile(r"_*cuda[A-Z]\w*"), ("token.device_launch", "CUDA runtime API")),
)
# The process environment, reachable in the host build without a call.
STRONG.update(_names("token.os_call", "process environment",
                     "environ __environ _environ"))
# ``exec*`` and ``spawn*`` come in many suffixed forms (execl, _spawnvpe...);
# a pattern covers them all.
EXEC_RE = re.compile(r"_?(?:exec|spawn)(?:l|le|lp|lpe|v|ve|vp|vpe)")
# Qualifiers a declarator may carry between ``*`` and the name, or before a
# parameter type; skipped when looking for a function pointer or type.
QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict"})
# Attribute words that may stand between ``__global__`` and the kernel's name,
# each possibly with a parenthesised argument list.
ATTRIBUTE_WORDS = frozenset(
    {"__launch_bounds__", "__attribute__", "__attribute", "__declspec", "alignas",
     "__align__", "__maxnreg__", "__cluster_dims__", "__annotate__",
     "__location__"}
)
# Built-in types: ``R(A...)`` with one of these as ``R`` spells a function type.
BUILTIN_TYPES = frozenset(
    {"void", "bool", "char", "char8_t", "char16_t", "char32_t", "wchar_t", "short",
     "int", "long", "float", "double", "signed", "unsigned"}
)
# Keywords that end an operand, so an operator after them is binary (``this +
# [...]`` is not a unary ``+`` on a lambda).
OPERAND_KEYWORDS = frozenset({"this", "true", "false", "nullptr"})
# Words followed by ``(`` that are not function calls or definitions, so they
# are never taken for a function's name.
NOT_FUNCTIONS = frozenset(
    {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
     "alignof", "static_assert", "noexcept", "typeid", "alignas", "throw"}
    | ATTRIBUTE_WORDS
)
# Keywords after which ``name (`` is an expression (a call), not a declarator.
EXPRESSION_KEYWORDS = frozenset(
    {"return", "else", "do", "case", "throw", "co_return", "co_yield",
     "co_await", "sizeof", "alignof", "typeid", "not", "and", "or", "xor",
     "bitand", "bitor", "compl", "not_eq", "and_eq", "or_eq", "xor_eq", "new",
     "delete", "goto", "default"}
)

# ---- the call allowlist (layer 3c) -------------------------------------------

# CUDA device functions a kernel may call, by name: barriers, warp and block
# primitives, memory and cache intrinsics, integer intrinsics, timers.
ALLOWED_CALLS = frozenset("""
__syncthreads __syncthreads_count __syncthreads_and __syncthreads_or __syncwarp
__threadfence __threadfence_block __threadfence_system __shfl_sync
__shfl_up_sync __shfl_down_sync __shfl_xor_sync __shfl __shfl_up __shfl_down
__shfl_xor __ballot_sync __any_sync __all_sync __uni_sync __ballot __any __all
__activemask __match_any_sync __match_all_sync __reduce_add_sync
__reduce_min_sync __reduce_max_sync __reduce_and_sync __reduce_or_sync
__reduce_xor_sync __nanosleep __ldg __ldcg __ldca __ldcs __ldlu __ldcv __stwb
__stcg __stcs __stwt __isGlobal __isShared __isConstant __isLocal
__isGridConstant memcpy memset clock clock64 __popc __popcll __clz __clzll
__ffs __ffsll __brev __brevll __byte_perm __funnelshift_l __funnelshift_lc
__funnelshift_r __funnelshift_rc __mul24 __umul24 __mulhi __umulhi __mul64hi
__umul64hi __sad __usad __hadd __rhadd __uhadd __urhadd __dp4a __dp2a_lo
__dp2a_hi __fns __hiloint2double __fdividef __expf __exp10f __logf __log2f
__log10f __sinf __cosf __sincosf __tanf __powf __saturatef __tanhf fdividef min
max umin umax llmin llmax ullmin ullmax abs labs llabs isfinite isinf isnan signbit
""".split()) | frozenset(
    # The CUDA math API, single (suffix f) and double precision.
    name
    for base in """
    acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh cospi
    cyl_bessel_i0 cyl_bessel_i1 erf erfc erfcinv erfcx erfinv exp exp10 exp2
    expm1 fabs fdim floor fma fmax fmin fmod frexp hypot ilogb j0 j1 jn ldexp
    lgamma llrint llround log log10 log1p log2 logb lrint lround modf nan
    nearbyint nextafter norm norm3d norm4d normcdf normcdfinv pow rcbrt
    remainder remquo rhypot rint rnorm rnorm3d rnorm4d round rsqrt scalbln
    scalbn sin sincos sincospi sinh sinpi sqrt tan tanh tgamma trunc y0 y1 yn
    """.split()
    for name in (base, base + "f")
)
# Families of CUDA intrinsics too regular to list: atomics with their scopes,
# rounding-mode arithmetic, conversions and reinterpretations, SIMD video
# intrinsics, the half and bfloat16 functions of cuda_fp16.h/cuda_bf16.h, and
# the vector-type constructors.
_NUM = (r"(?:float|floats|double|int|uint|ll|ull|half|bfloat16|short|ushort|"
        r"float2|half2|bfloat162|hi|lo|longlong|ulonglong)")
ALLOWED_CALL_RE = re.compile("|".join((
    r"atomic(?:Add|Sub|Exch|Min|Max|Inc|Dec|CAS|And|Or|Xor)(?:_block|_system)?",
    r"__(?:f|d)(?:add|sub|mul|div|rcp|sqrt|rsqrt)_r[nzud]",
    r"__fmaf?(?:_ieee)?_r[nzud]",
    rf"__{_NUM}2{_NUM}(?:2|int)?(?:_r[nzud]|_sat)?",
    rf"__{_NUM}_as_{_NUM}",
    r"__v[a-z]+[24]",
    r"__h(?:add|sub|mul|div|fma|neg|abs|eq|ne|lt|le|gt|ge|equ|neu|ltu|leu|gtu|"
    r"geu|beq|bne|blt|ble|bgt|bge|bequ|bneu|bltu|bleu|bgtu|bgeu|max|min|isnan|"
    r"isinf|cmadd)\w*",
    r"__h2div|__(?:low|high|lows|highs|halves|lowhigh)2\w+",
    r"h2?(?:sqrt|rsqrt|rcp|exp|exp2|exp10|log|log2|log10|sin|cos|tanh|ceil|"
    r"floor|trunc|rint)",
    r"make_(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]",
    r"make_(?:half2|bfloat162)",
)))
# Types a kernel may name in a functional cast (``float2(...)`` is not, but
# ``__half(x)``, ``size_t(i)`` and ``T(x)`` are): CUDA's vector, half and
# bfloat16 types and the fixed-width integers. Built-in types and the
# source's own types are allowed too.
CUDA_TYPE_RE = re.compile(
    r"(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]|dim3|"
    r"__half2?|half2?|__nv_bfloat162?|nv_bfloat162?|__half2?_raw|"
    r"__nv_bfloat162?_raw|size_t|ptrdiff_t|u?int(?:8|16|32|64)_t|u?intptr_t"
)
# Attributes a kernel may carry (leading and trailing ``__`` dropped, so
# ``__noinline__`` is ``noinline``); aliasing, start-up and section
# attributes (``alias``, ``weakref``, ``ifunc``, ``constructor``,
# ``destructor``, ``section``, ``cleanup``, ``visibility``...) are not.
ALLOWED_ATTRIBUTES = frozenset("""
aligned align noinline always_inline forceinline inline_hint unused
maybe_unused nodiscard likely unlikely fallthrough deprecated noreturn pure
const hot cold flatten launch_bounds maxnreg cluster_dims grid_constant global
device host shared constant managed restrict carries_dependency
no_unique_address
""".split())
# C library functions the host emulation build declares in the global
# namespace (through cuda_emu.h's standard headers), math functions left out.
# A source's own function or class with one of these names would share an
# overload set with the library's (or be hidden by it), so that the host build
# calls the library where NVRTC calls the source's own code.
HOST_LIBRARY_NAMES = frozenset("""
    a64l abort aligned_alloc alloca arc4random arc4random_buf
    arc4random_uniform asctime asctime_r asprintf atexit atof atoi atol
    atoll bcmp bcopy bsearch btowc bzero calloc canonicalize_file_name
    clearenv clearerr clearerr_unlocked clock_adjtime clock_getcpuclockid
    clock_getres clock_gettime clock_nanosleep clock_settime clone ctermid
    ctime ctime_r cuserid difftime div dprintf drand48 drand48_r duplocale
    dysize ecvt ecvt_r erand48 erand48_r exit explicit_bzero fclose
    fcloseall fcvt fcvt_r fdopen feof feof_unlocked ferror ferror_unlocked
    fflush fflush_unlocked ffs ffsl ffsll fgetc fgetc_unlocked fgetpos
    fgetpos64 fgets fgets_unlocked fgetwc fgetwc_unlocked fgetws
    fgetws_unlocked fileno fileno_unlocked flockfile fmemopen fopen fopen64
    fopencookie fprintf fputc fputc_unlocked fputs fputs_unlocked fputwc
    fputwc_unlocked fputws fputws_unlocked fread fread_unlocked free
    freelocale freopen freopen64 fscanf fseek fseeko fseeko64 fsetpos
    fsetpos64 ftell ftello ftello64 ftrylockfile funlockfile fwide fwprintf
    fwrite fwrite_unlocked fwscanf gcvt getc getc_unlocked getchar
    getchar_unlocked getcpu getdate getdate_r getdelim getenv getline
    getloadavg getpt getsubopt getw getwc getwc_unlocked getwchar
    getwchar_unlocked gmtime gmtime_r grantpt index initstate initstate_r
    isalnum isalnum_l isalpha isalpha_l isascii isblank isblank_l iscntrl
    iscntrl_l isctype isdigit isdigit_l isgraph isgraph_l islower islower_l
    isprint isprint_l ispunct ispunct_l isspace isspace_l isupper isupper_l
    isxdigit isxdigit_l jrand48 jrand48_r l64a lcong48 lcong48_r ldiv lldiv
    localeconv localtime localtime_r lrand48 lrand48_r malloc mblen mbrlen
    mbrtowc mbsinit mbsnrtowcs mbsrtowcs mbstowcs mbtowc memccpy memchr
    memcmp memfrob memmem memmove mempcpy mkdtemp mkostemp mkostemp64
    mkostemps mkostemps64 mkstemp mkstemp64 mkstemps mkstemps64 mktemp
    mktime mrand48 mrand48_r nanosleep newlocale nrand48 nrand48_r
    obstack_printf obstack_vprintf on_exit open_memstream open_wmemstream
    pclose perror popen posix_memalign posix_openpt printf pselect
    pthread_atfork pthread_attr_destroy pthread_attr_getaffinity_np
    pthread_attr_getdetachstate pthread_attr_getguardsize
    pthread_attr_getinheritsched pthread_attr_getschedparam
    pthread_attr_getschedpolicy pthread_attr_getscope
    pthread_attr_getsigmask_np pthread_attr_getstack
    pthread_attr_getstackaddr pthread_attr_getstacksize pthread_attr_init
    pthread_attr_setaffinity_np pthread_attr_setdetachstate
    pthread_attr_setguardsize pthread_attr_setinheritsched
    pthread_attr_setschedparam pthread_attr_setschedpolicy
    pthread_attr_setscope pthread_attr_setsigmask_np pthread_attr_setstack
    pthread_attr_setstackaddr pthread_attr_setstacksize
    pthread_barrier_destroy pthread_barrier_init pthread_barrier_wait
    pthread_barrierattr_destroy pthread_barrierattr_getpshared
    pthread_barrierattr_init pthread_barrierattr_setpshared pthread_cancel
    pthread_clockjoin_np pthread_cond_broadcast pthread_cond_clockwait
    pthread_cond_destroy pthread_cond_init pthread_cond_signal
    pthread_cond_timedwait pthread_cond_wait pthread_condattr_destroy
    pthread_condattr_getclock pthread_condattr_getpshared
    pthread_condattr_init pthread_condattr_setclock
    pthread_condattr_setpshared pthread_create pthread_detach pthread_equal
    pthread_exit pthread_getaffinity_np pthread_getattr_default_np
    pthread_getattr_np pthread_getconcurrency pthread_getcpuclockid
    pthread_getname_np pthread_getschedparam pthread_getspecific
    pthread_join pthread_key_create pthread_key_delete
    pthread_mutex_clocklock pthread_mutex_consistent
    pthread_mutex_consistent_np pthread_mutex_destroy
    pthread_mutex_getprioceiling pthread_mutex_init pthread_mutex_lock
    pthread_mutex_setprioceiling pthread_mutex_timedlock
    pthread_mutex_trylock pthread_mutex_unlock pthread_mutexattr_destroy
    pthread_mutexattr_getprioceiling pthread_mutexattr_getprotocol
    pthread_mutexattr_getpshared pthread_mutexattr_getrobust
    pthread_mutexattr_getrobust_np pthread_mutexattr_gettype
    pthread_mutexattr_init pthread_mutexattr_setprioceiling
    pthread_mutexattr_setprotocol pthread_mutexattr_setpshared
    pthread_mutexattr_setrobust pthread_mutexattr_setrobust_np
    pthread_mutexattr_settype pthread_once pthread_rwlock_clockrdlock
    pthread_rwlock_clockwrlock pthread_rwlock_destroy pthread_rwlock_init
    pthread_rwlock_rdlock pthread_rwlock_timedrdlock
    pthread_rwlock_timedwrlock pthread_rwlock_tryrdlock
    pthread_rwlock_trywrlock pthread_rwlock_unlock pthread_rwlock_wrlock
    pthread_rwlockattr_destroy pthread_rwlockattr_getkind_np
    pthread_rwlockattr_getpshared pthread_rwlockattr_init
    pthread_rwlockattr_setkind_np pthread_rwlockattr_setpshared pthread_self
    pthread_setaffinity_np pthread_setattr_default_np pthread_setcancelstate
    pthread_setcanceltype pthread_setconcurrency pthread_setname_np
    pthread_setschedparam pthread_setschedprio pthread_setspecific
    pthread_spin_destroy pthread_spin_init pthread_spin_lock
    pthread_spin_trylock pthread_spin_unlock pthread_testcancel
    pthread_timedjoin_np pthread_tryjoin_np pthread_yield ptsname ptsname_r
    putc putc_unlocked putchar putchar_unlocked putenv puts putw putwc
    putwc_unlocked putwchar putwchar_unlocked qecvt qecvt_r qfcvt qfcvt_r
    qgcvt qsort qsort_r quick_exit rand rand_r random random_r realloc
    reallocarray realpath remove rename renameat renameat2 rewind rindex
    rpmatch scanf sched_get_priority_max sched_get_priority_min
    sched_getaffinity sched_getcpu sched_getparam sched_getscheduler
    sched_rr_get_interval sched_setaffinity sched_setparam
    sched_setscheduler sched_yield secure_getenv seed48 seed48_r select
    setbuf setbuffer setenv setlinebuf setlocale setns setstate setstate_r
    setvbuf sigabbrev_np sigdescr_np snprintf sprintf srand srand48
    srand48_r srandom srandom_r sscanf stpcpy stpncpy strcasecmp
    strcasecmp_l strcat strchr strcmp strcoll strcoll_l strcpy strcspn
    strdup strerror strerror_l strerror_r strerrordesc_np strerrorname_np
    strfromd strfromf strfromf128 strfromf32 strfromf32x strfromf64
    strfromf64x strfroml strfry strftime strftime_l strlen strncasecmp
    strncasecmp_l strncat strncmp strncpy strndup strnlen strpbrk strptime
    strptime_l strrchr strsep strsignal strspn strstr strtod strtod_l strtof
    strtof128 strtof128_l strtof32 strtof32_l strtof32x strtof32x_l strtof64
    strtof64_l strtof64x strtof64x_l strtof_l strtok strtok_r strtol
    strtol_l strtold strtold_l strtoll strtoll_l strtoq strtoul strtoul_l
    strtoull strtoull_l strtouq strverscmp strxfrm strxfrm_l swprintf
    swscanf system tempnam time timegm timelocal timer_create timer_delete
    timer_getoverrun timer_gettime timer_settime timespec_get
    timespec_getres tmpfile tmpfile64 tmpnam tmpnam_r toascii tolower
    tolower_l toupper toupper_l tzset ungetc ungetwc unlockpt unsetenv
    unshare uselocale valloc vasprintf vdprintf vfprintf vfscanf vfwprintf
    vfwscanf vprintf vscanf vsnprintf vsprintf vsscanf vswprintf vswscanf
    vwprintf vwscanf wcpcpy wcpncpy wcrtomb wcscasecmp wcscasecmp_l wcscat
    wcschrnul wcscmp wcscoll wcscoll_l wcscpy wcscspn wcsdup wcsftime
    wcsftime_l wcslen wcsncasecmp wcsncasecmp_l wcsncat wcsncmp wcsncpy
    wcsnlen wcsnrtombs wcsrtombs wcsspn wcstod wcstod_l wcstof wcstof128
    wcstof128_l wcstof32 wcstof32_l wcstof32x wcstof32x_l wcstof64
    wcstof64_l wcstof64x wcstof64x_l wcstof_l wcstok wcstol wcstol_l wcstold
    wcstold_l wcstoll wcstoll_l wcstombs wcstoq wcstoul wcstoul_l wcstoull
    wcstoull_l wcstouq wcswidth wcsxfrm wcsxfrm_l wctob wctomb wcwidth
    wmemcmp wmemcpy wmemmove wmempcpy wmemset wprintf wscanf
""".split())

# ---- the compilers' predefined macros (layer 2) ------------------------------

#: Architectures every source is scanned for, NVRTC's ``__CUDA_ARCH__`` / 10.
TARGET_ARCHS = (75, 80, 86, 89, 90)
# Macros NVRTC 12 defines before the first line of a source, other than
# ``__CUDA_ARCH__`` and ``__CUDA_ARCH_LIST__`` (set per architecture). A value
# of None means defined with a value the scanner does not assume (it changes
# between NVRTC releases or with the options, or is not a number): a
# conditional that depends on it is scanned both ways.
NVRTC_DEFINED: dict[str, int | None] = {
    "__CUDACC__": 1, "__CUDACC_RTC__": 1, "__CUDACC_VER_MAJOR__": 12,
    "__CUDACC_VER_MINOR__": None, "__CUDACC_VER_BUILD__": None,
    "__CUDA_API_VER_MAJOR__": 12, "__CUDA_API_VER_MINOR__": None,
    "__cplusplus": 201703, "__LP64__": 1, "__STDC__": 1, "__STDC_HOSTED__": 1,
    "__EDG__": 1, "__EDG_VERSION__": None, "__NVCC_DIAG_PRAGMA_SUPPORT__": 1,
    "__CUDACC_VER__": None, "__CUDA_PREC_DIV": None, "__CUDA_PREC_SQRT": None,
    "__CUDA_FTZ": None, "__USE_FAST_MATH__": None, "__INCLUDE_LEVEL__": 0,
    "NULL": 0, "CUDART_VERSION": None, **dict.fromkeys("""
    __host__ __device__ __global__ __shared__ __constant__ __managed__
    __forceinline__ __noinline__ __launch_bounds__ __location__ __annotate__
    __align__ __grid_constant__ __cudart_builtin__ __device_builtin__
    __inline_hint__ __maxnreg__ __cluster_dims__ __nv_register_params__
    __volatile__ __has_include __has_builtin __has_attribute
    __has_cpp_attribute __CUDA_ARCH_HAS_FEATURE__ __FILE__ __LINE__ __DATE__
    __TIME__ __BASE_FILE__ assert va_start va_arg va_end va_copy NV_IS_HOST
    NV_IS_DEVICE NV_ANY_TARGET NV_NO_TARGET NV_IF_TARGET NV_IF_ELSE_TARGET
    NV_DISPATCH_TARGET CUDARTAPI CUDART_CB CUDART_DEVICE
    """.split()),
}
# Names NVRTC leaves undefined (host compilers', other platforms', options
# the allowlist refuses): a conditional on them is decided, not forked.
NVRTC_UNDEFINED = frozenset("""
__GNUC__ __GNUC_MINOR__ __GNUC_PATCHLEVEL__ __GNUG__ __clang__ __clang_major__
__clang_minor__ __llvm__ __INTEL_COMPILER __linux__ __linux __gnu_linux__
__unix__ __unix __x86_64__ __x86_64 __amd64__ __amd64 __i386__ __aarch64__
__arm__ __powerpc64__ _WIN32 _WIN64 _MSC_VER __APPLE__ __MACH__ __ELF__
__NVCC__ __CUDA__ __HIP__ __HIPCC__ __HIP_PLATFORM_AMD__
__HIP_PLATFORM_NVIDIA__ __HIP_DEVICE_COMPILE__ __OPENCL_VERSION__
__SYCL_DEVICE_ONLY__ _OPENMP __OPTIMIZE__ __FAST_MATH__ __STDC_VERSION__
__COUNTER__ __TIMESTAMP__ __CUDACC_DEBUG__ __CUDACC_RDC__ __CUDACC_EWP__
__CUDACC_RELAXED_CONSTEXPR__ __CUDACC_EXTENDED_LAMBDA__ __CUDACC_RTC_INT128__
__CUDACC_RTC_MINIMAL__ __CUDA_NO_HALF_OPERATORS__ __CUDA_NO_HALF_CONVERSIONS__
__CUDA_NO_HALF2_OPERATORS__ __CUDA_NO_BFLOAT16_OPERATORS__
__CUDA_NO_BFLOAT16_CONVERSIONS__ __CUDA_NO_BFLOAT162_OPERATORS__ _LP64
__CHAR_BIT__ __SIZEOF_POINTER__ __BYTE_ORDER__ __ORDER_LITTLE_ENDIAN__
__CUDA_ARCH_SPECIFIC__ __CUDA_ARCH_FAMILY_SPECIFIC__
""".split())
# Unreserved names NVRTC's built-in headers (and cuda_fp16.h/cuda_bf16.h)
# define by the hundred (``NV_PROVIDES_SM_80``, ``CUDART_INF_FP16``,
# ``cudaStreamDefault``...): one not listed above is taken as maybe defined.
NVRTC_MAYBE_RE = re.compile(
    r"NV_\w+|CUDA\w*|CU_\w+|cuda[A-Z]\w*|va_\w+|warpSize|IF_DEVICE_OR_CUDACC"
)
# The host emulation build: g++ or clang++ -std=c++17 on x86-64 Linux, with
# cuda_emu.h included first (its ``__global__``... are empty macros). The
# macros of the C and C++ headers are not modelled: the host build is to
# compile the NVRTC-preprocessed text, where no conditional is left.
HOST_DEFINED: dict[str, int | None] = {
    "__cplusplus": 201703, "__STDC__": 1, "__STDC_HOSTED__": 1, "__linux__": 1,
    "__linux": 1, "__gnu_linux__": 1, "__unix__": 1, "__unix": 1,
    "__x86_64__": 1, "__x86_64": 1, "__amd64__": 1, "__amd64": 1,
    "__LP64__": 1, "_LP64": 1, "__ELF__": 1, "__CHAR_BIT__": 8,
    "__SIZEOF_POINTER__": 8, "__ORDER_LITTLE_ENDIAN__": 1234,
    "__BYTE_ORDER__": 1234, "__GNUC__": None, "__GNUC_MINOR__": None,
    "__GNUG__": None, "NULL": None, **dict.fromkeys("""
    GH_CUDA_EMU_H GH_KERNEL_SOURCE GH_ENTRIES __global__ __device__ __host__
    __forceinline__ __shared__ __launch_bounds__ __has_include __has_builtin
    __has_attribute __has_cpp_attribute __FILE__ __LINE__ __DATE__ __TIME__
    __COUNTER__ __BASE_FILE__ __INCLUDE_LEVEL__
    """.split()),
}
HOST_UNDEFINED = frozenset("""
__CUDACC__ __CUDA_ARCH__ __CUDACC_RTC__ __NVCC__ __CUDA_ARCH_LIST__
__CUDACC_VER_MAJOR__ __CUDACC_VER_MINOR__ __CUDACC_VER_BUILD__
__CUDA_API_VER_MAJOR__ __CUDA_API_VER_MINOR__ __EDG__ __EDG_VERSION__ _WIN32
_WIN64 _MSC_VER __APPLE__ __MACH__ __HIP__ __HIPCC__ __CUDA__ __i386__
__aarch64__ __arm__ __STDC_VERSION__
""".split())
