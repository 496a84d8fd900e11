/* Lists a directory the way a C program does, for the listing tests: one line per entry,
   "<name> <type>" (type: reg, dir, lnk, other, unknown), sorted by name, "." and ".."
   included. How it lists is the first argument:
     readdir    opendir + readdir until the end (the common case)
     readdir64  opendir + readdir64
     rewind     opendir, readdir once, rewinddir, then the whole listing
     fdopendir  open(O_DIRECTORY) + fdopendir + readdir
     scandir    scandir(3) (glibc's opens its stream internally, not through opendir)
   Exit 0 with the listing on stdout; 1 with the error on stderr. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char* type_name(unsigned char t) {
  switch (t) {
    case DT_REG:
      return "reg";
    case DT_DIR:
      return "dir";
    case DT_LNK:
      return "lnk";
    case DT_UNKNOWN:
      return "unknown";
    default:
      return "other";
  }
}

static int by_name(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

static char* entry_line(const char* name, unsigned char type) {
  char* line = NULL;
  if (asprintf(&line, "%s %s", name, type_name(type)) < 0) abort();
  return line;
}

static int print_sorted(char** lines, size_t n) {
  qsort(lines, n, sizeof(char*), by_name);
  for (size_t i = 0; i < n; ++i) {
    puts(lines[i]);
    free(lines[i]);
  }
  free(lines);
  return 0;
}

static int list_stream(DIR* dir, int use64) {
  size_t n = 0, cap = 16;
  char** lines = malloc(cap * sizeof(char*));
  for (;;) {
    errno = 0;
    const char* name;
    unsigned char type;
    if (use64) {
      struct dirent64* e = readdir64(dir);
      if (e == NULL) break;
      name = e->d_name;
      type = e->d_type;
    } else {
      struct dirent* e = readdir(dir);
      if (e == NULL) break;
      name = e->d_name;
      type = e->d_type;
    }
    if (n == cap) lines = realloc(lines, (cap *= 2) * sizeof(char*));
    lines[n++] = entry_line(name, type);
  }
  if (errno != 0) {
    perror("readdir");
    return 1;
  }
  closedir(dir);
  return print_sorted(lines, n);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s readdir|readdir64|rewind|fdopendir|scandir DIR\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  const char* path = argv[2];
  if (strcmp(mode, "scandir") == 0) {
    struct dirent** list = NULL;
    const int n = scandir(path, &list, NULL, NULL);
    if (n < 0) {
      perror("scandir");
      return 1;
    }
    char** lines = malloc((size_t)(n > 0 ? n : 1) * sizeof(char*));
    for (int i = 0; i < n; ++i) {
      lines[i] = entry_line(list[i]->d_name, list[i]->d_type);
      free(list[i]);
    }
    free(list);
    return print_sorted(lines, (size_t)n);
  }
  DIR* dir = NULL;
  if (strcmp(mode, "fdopendir") == 0) {
    const int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      perror("open");
      return 1;
    }
    dir = fdopendir(fd);
  } else {
    dir = opendir(path);
  }
  if (dir == NULL) {
    perror("opendir");
    return 1;
  }
  if (strcmp(mode, "rewind") == 0) {
    (void)readdir(dir);
    rewinddir(dir);
  }
  return list_stream(dir, strcmp(mode, "readdir64") == 0);
}
