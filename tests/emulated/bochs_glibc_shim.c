/* The bochscpu-python wheel (built against glibc 2.38) calls two C23 entry
 * points that glibc 2.36 (Debian 12) lacks. They differ from the classic
 * functions only in accepting the 0b binary syntax, which Bochs' own parsing
 * never meets, so they forward to them. bochs_guest.py loads this library
 * (RTLD_GLOBAL) before the extension when the first import fails on them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

unsigned long long __isoc23_strtoull(const char* text, char** end, int base) {
  return strtoull(text, end, base);
}

int __isoc23_sscanf(const char* text, const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int assigned = vsscanf(text, format, args);
  va_end(args);
  return assigned;
}
