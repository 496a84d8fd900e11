#pragma once
#include <string>

// Starts counting open()/open64() calls whose path is exactly `path` (resets the count).
void watch_opens(const std::string& path);
int watched_opens();
