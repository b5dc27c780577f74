/* Hide AVX-512, AVX-VNNI and AMX from every CPUID a process executes, so that a benchmark run on an
 * AVX-512 host dispatches the kernels an AVX2-only CPU would get (onnxruntime's MLAS, oneDNN in PyTorch and
 * OpenVINO, numpy, Triton's backends). A stand-in for an AVX2-only machine, not one: the cores, caches and
 * clocks stay this host's.
 *
 * How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, CPU flag cpuid_fault) makes CPUID trap; the
 * SIGSEGV handler executes the real CPUID with faulting briefly off, clears the hidden bits and steps over
 * the instruction. The setting is per thread and inherited by new threads; execve resets it, so the library
 * is preloaded (LD_PRELOAD) into every process. A SIGSEGV handler the program installs is kept and called
 * for every fault that is not a CPUID.
 *
 * Usage: benchmarks/as_avx2_only.sh COMMAND... (builds this file, masks /proc/cpuinfo as well).
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static sigaction_fn real_sigaction;
static struct sigaction program_handler; /* what the program believes handles SIGSEGV */
static int active;

#define BIT(n) (1u << (n))

static void hide(unsigned leaf, unsigned sub, unsigned *a, unsigned *b, unsigned *c, unsigned *d) {
    if (leaf == 7 && sub == 0) {
        /* AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL */
        *b &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
        /* AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        *c &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        /* AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8 */
        *d &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && sub == 1) {
        /* AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA */
        *a &= ~(BIT(4) | BIT(5) | BIT(21) | BIT(23));
        /* AVX-VNNI-INT8, AVX-NE-CONVERT, AMX-COMPLEX, AVX-VNNI-INT16, AVX10 */
        *d &= ~(BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19));
    } else if (leaf == 0xd && sub == 0) {
        /* XSAVE components: opmask, ZMM_Hi256, Hi16_ZMM, AMX TILECFG, TILEDATA */
        *a &= ~(BIT(5) | BIT(6) | BIT(7) | BIT(17) | BIT(18));
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {
        *a = *b = *c = *d = 0; /* AMX tile and AVX10 leaves */
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    if (info->si_code == SI_KERNEL && ip && ip[0] == 0x0f && ip[1] == 0xa2) {
        unsigned leaf = (unsigned)regs[REG_RAX], sub = (unsigned)regs[REG_RCX], a, b, c, d;
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        __cpuid_count(leaf, sub, a, b, c, d);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        hide(leaf, sub, &a, &b, &c, &d);
        regs[REG_RAX] = a;
        regs[REG_RBX] = b;
        regs[REG_RCX] = c;
        regs[REG_RDX] = d;
        regs[REG_RIP] += 2;
        return;
    }
    if (program_handler.sa_flags & SA_SIGINFO) {
        program_handler.sa_sigaction(sig, info, context);
    } else if (program_handler.sa_handler != SIG_DFL && program_handler.sa_handler != SIG_IGN) {
        program_handler.sa_handler(sig);
    } else {
        /* the default action: die by this signal, as without us */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
        if (info->si_code <= 0) raise(SIGSEGV); /* sent, not a fault: a fault repeats on return */
    }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGSEGV || !active) return real_sigaction(sig, act, old);
    if (old) *old = program_handler;
    if (act) program_handler = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

__attribute__((constructor)) static void start(void) {
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    if (real_sigaction(SIGSEGV, &act, &program_handler) != 0) return;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        fprintf(stderr, "cpuid_mask: this CPU or kernel has no CPUID faulting (flag cpuid_fault); "
                        "nothing is hidden\n");
        real_sigaction(SIGSEGV, &program_handler, NULL);
        _exit(3);
    }
    active = 1;
}
