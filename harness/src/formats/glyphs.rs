//! Text in the PNG picture, rasterized with ab_glyph from the embedded DejaVu Sans.
//!
//! plotters 0.3.7 draws ab_glyph text without each glyph's left side bearing and
//! puts every glyph's box at half the font size below the anchor, so letters are
//! unevenly spaced (`den oise`) and periods float at mid-height (`load·dit`).
//! [`GlyphText`] wraps a pixel backend and draws horizontal text itself: the pen
//! advances by each glyph's advance plus kerning, each outline is placed at its own
//! bounds on a common baseline, and the anchor ([`HPos`], [`VPos`]) is applied to the
//! advance width and to the font's ascent..descent box. Rotated text and every
//! other primitive go to the wrapped backend unchanged.

use std::sync::OnceLock;

use ab_glyph::{point, Font, FontRef, PxScale, ScaleFont};
use plotters::style::text_anchor::{HPos, VPos};
use plotters::style::{FontStyle, FontTransform};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// DejaVu Sans (regular, bold), parsed once per process.
fn fonts() -> Option<&'static (FontRef<'static>, FontRef<'static>)> {
    static FONTS: OnceLock<Option<(FontRef<'static>, FontRef<'static>)>> = OnceLock::new();
    FONTS
        .get_or_init(|| {
            let regular = FontRef::try_from_slice(dejavu::sans::regular()).ok()?;
            let bold = FontRef::try_from_slice(dejavu::sans::bold()).ok()?;
            Some((regular, bold))
        })
        .as_ref()
}

/// The error of a font that does not parse (the embedded one always does).
#[derive(Debug, thiserror::Error)]
#[error("the embedded DejaVu Sans font did not parse")]
pub struct FontUnavailable;

/// Where the glyphs of `text` go: `(pen x of the first glyph, baseline y)` in
/// pixels relative to the anchor point, for a font `size` pixels high.
/// `width_px` is the advance width of the whole text.
fn origin(
    anchor: plotters::style::text_anchor::Pos,
    width_px: f32,
    ascent: f32,
    descent: f32,
) -> (f32, f32) {
    let x = match anchor.h_pos {
        HPos::Left => 0.0,
        HPos::Center => -width_px / 2.0,
        HPos::Right => -width_px,
    };
    // `descent` is negative (below the baseline), as ab_glyph reports it.
    let y = match anchor.v_pos {
        VPos::Top => ascent,
        VPos::Center => (ascent + descent) / 2.0,
        VPos::Bottom => descent,
    };
    (x, y)
}

/// The advance width of `text` in pixels at `size` (kerning included).
pub fn text_width(text: &str, size: f32, bold: bool) -> Option<f32> {
    let (regular, b) = fonts()?;
    let font = if bold { b } else { regular }.as_scaled(PxScale::from(size));
    let mut w = 0.0;
    let mut prev = None;
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(p) = prev {
            w += font.kern(p, id);
        }
        w += font.h_advance(id);
        prev = Some(id);
    }
    Some(w)
}

/// A pixel backend whose horizontal text is drawn by [`GlyphText::draw_text`].
pub struct GlyphText<B: DrawingBackend> {
    inner: B,
}

impl<B: DrawingBackend> GlyphText<B> {
    /// Wrap `inner`.
    pub fn new(inner: B) -> Self {
        GlyphText { inner }
    }
}

impl<B: DrawingBackend> DrawingBackend for GlyphText<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }
    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }
    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }
    fn estimate_text_size<TStyle: BackendTextStyle>(
        &self,
        text: &str,
        style: &TStyle,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        self.inner.estimate_text_size(text, style)
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        if !matches!(style.transform(), FontTransform::None) {
            return self.inner.draw_text(text, style, pos);
        }
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (regular, bold) =
            fonts().ok_or_else(|| DrawingErrorKind::FontError(Box::new(FontUnavailable)))?;
        let is_bold = matches!(style.style(), FontStyle::Bold);
        let size = style.size() as f32;
        let font = if is_bold { bold } else { regular }.as_scaled(PxScale::from(size));
        let width = text_width(text, size, is_bold).unwrap_or(0.0);
        let (x0, baseline) = origin(style.anchor(), width, font.ascent(), font.descent());
        let (ox, oy) = (pos.0 as f32 + x0, pos.1 as f32 + baseline);
        let mut pen = 0.0f32;
        let mut prev = None;
        let mut pixels: Vec<(i32, i32, f32)> = Vec::new();
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                pen += font.kern(p, id);
            }
            let glyph = id.with_scale_and_position(font.scale(), point(ox + pen, oy));
            if let Some(outline) = font.outline_glyph(glyph) {
                let b = outline.px_bounds();
                outline.draw(|x, y, coverage| {
                    pixels.push((
                        b.min.x as i32 + x as i32,
                        b.min.y as i32 + y as i32,
                        coverage,
                    ));
                });
            }
            pen += font.h_advance(id);
            prev = Some(id);
        }
        for (x, y, coverage) in pixels {
            if coverage > 0.0 {
                self.inner
                    .draw_pixel((x, y), color.mix(f64::from(coverage.min(1.0))))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;
    use plotters::style::text_anchor::Pos;

    /// Draw `text` at (150, 30) in `size`-pixel type with `anchor` on a white
    /// 300x60 picture; return the bounding box (x0, y0, x1, y1) of the ink.
    fn ink_at(text: &str, size: u32, anchor: Pos) -> (u32, u32, u32, u32) {
        // plotters' own text path (the mutation this guards against) needs the font
        // registered; the real picture registers it the same way.
        crate::formats::plot::fonts().unwrap();
        let (w, h) = (300u32, 60u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root =
                GlyphText::new(BitMapBackend::with_buffer(&mut buf, (w, h))).into_drawing_area();
            root.draw_text(
                text,
                &("sans-serif", size).into_font().color(&BLACK).pos(anchor),
                (150, 30),
            )
            .unwrap();
            root.present().unwrap();
        }
        let (mut x0, mut y0, mut x1, mut y1) = (w, h, 0, 0);
        for y in 0..h {
            for x in 0..w {
                let i = ((y * w + x) * 3) as usize;
                if buf[i..i + 3] != [255, 255, 255] {
                    (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
                }
            }
        }
        (x0, y0, x1, y1)
    }

    fn ink(text: &str, anchor: Pos) -> (u32, u32, u32, u32) {
        ink_at(text, 20, anchor)
    }

    #[test]
    fn a_period_sits_on_the_baseline_and_glyphs_keep_their_bearings() {
        let top_left = Pos::new(HPos::Left, VPos::Top);
        // At every size the picture uses, "l" and "." end on the same row (the
        // baseline); plotters' own drawing lifts small glyphs by a pixel or two.
        for size in [12, 13, 14, 16, 22] {
            let (_, _, _, l_bottom) = ink_at("l", size, top_left);
            let (_, _, _, dot_bottom) = ink_at(".", size, top_left);
            assert_eq!(l_bottom, dot_bottom, "size {size}");
        }
        // "i" starts at its left side bearing from the anchor, not at the anchor.
        let (regular, _) = fonts().unwrap();
        let f = regular.as_scaled(PxScale::from(30.0));
        let lsb = f.h_side_bearing(f.glyph_id('i'));
        assert!(
            lsb > 2.0,
            "DejaVu's i has a visible bearing at 30 px: {lsb}"
        );
        let (x0, _, _, _) = ink_at("i", 30, top_left);
        assert!(
            (x0 as f32 - (150.0 + lsb)).abs() <= 1.0,
            "ink at {x0}, bearing {lsb}"
        );
        // The ink spans the advance width to within the side bearings (3 px).
        let want = text_width("denoise.step", 20.0, false).unwrap();
        let (x0, _, x1, _) = ink("denoise.step", top_left);
        let got = (x1 - x0 + 1) as f32;
        assert!((got - want).abs() <= 3.0, "ink {got} px, advance {want} px");
    }

    #[test]
    fn anchors_place_the_text_around_the_point() {
        let w = text_width("GPU power", 20.0, false).unwrap();
        let (l0, _, l1, _) = ink("GPU power", Pos::new(HPos::Left, VPos::Center));
        let (r0, _, r1, _) = ink("GPU power", Pos::new(HPos::Right, VPos::Center));
        let (c0, cy0, c1, cy1) = ink("GPU power", Pos::new(HPos::Center, VPos::Center));
        assert!((150..=152).contains(&l0), "left starts at the point: {l0}");
        assert!((147..=150).contains(&r1), "right ends at the point: {r1}");
        for (a, b) in [(l0, l1), (c0, c1)] {
            assert!(
                (b - a).abs_diff(r1 - r0) <= 1,
                "same ink width at every anchor"
            );
        }
        assert!((c0 as f32 - (150.0 - w / 2.0)).abs() <= 2.0, "centre: {c0}");
        // Vertically centred: the ink (cap height to descender of "p") straddles y=30.
        assert!(cy0 < 30 && cy1 > 30, "{cy0}..{cy1}");
        let (_, ty0, _, _) = ink("GPU", Pos::new(HPos::Left, VPos::Top));
        let (_, _, _, by1) = ink("GPU", Pos::new(HPos::Left, VPos::Bottom));
        assert!(
            ty0 >= 30 && by1 <= 30,
            "top below the point, bottom above it"
        );
    }
}
